"""Typed statistics of one RelayEngine: what `engine.stats()` returns and the metrics read.

Every field is a number, a flag or a nested dataclass, so the metrics exporter maps fields by name
and a renamed field fails a test instead of silently zeroing a metric.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mindspore_relaygr.cache.hierarchy import CacheTierStats
from mindspore_relaygr.relay.audit import AuditStats
from mindspore_relaygr.relay.ledger import LedgerStats
from mindspore_relaygr.relay.trigger import TriggerStats


@dataclass(slots=True)
class RankTierCounts:
    """Ranks served, one count per rank, by the tier that served it (see types.CACHE_TIERS)."""

    device: int = 0
    dram: int = 0
    partial: int = 0  # a cached prefix extended by the events since
    inflight: int = 0  # waited for the key's relay, then served from the device
    miss: int = 0
    bypass: int = 0  # relay disabled (the baseline)

    @property
    def device_misses(self) -> int:
        """Relay ranks the device tier could not serve (reloaded from DRAM or computed in full)."""
        return self.dram + self.miss


@dataclass(slots=True)
class DeviceWorkCounts:
    """Work the engine did or refused, counted where it happened."""

    prefills: int = 0  # completed
    prefill_chunks: int = 0
    prefill_events: int = 0  # events computed by prefills (extensions: cache.extended_tokens)
    prefill_errors: int = 0
    prefill_no_slot: int = 0
    dram_prefetches: int = 0  # DRAM copies reloaded at pre-infer time
    extensions: int = 0  # cached prefixes extended by the events since (pre-infer relays and ranks)
    extension_chunks: int = 0
    inflight_waits: int = 0  # ranks that found their prefix's relay still running and waited for it
    inflight_boosts: int = 0
    inflight_wait_timeouts: int = 0
    truncations: int = 0


@dataclass
class EngineStats:
    instance: str
    model_version: str
    ready: bool
    relay_enabled: bool
    queue_depth: int
    copy_bytes_per_s: float  # DRAM -> device bandwidth the reload decision uses
    slot_bytes: int
    ranks: RankTierCounts
    work: DeviceWorkCounts
    relays: LedgerStats
    trigger: TriggerStats
    cache: CacheTierStats
    audit: AuditStats
    preinfers: dict[str, int] = field(default_factory=dict)  # decisions by reason (incl. "disabled")
    device_steps: dict[str, Any] = field(default_factory=dict)  # executor step stats per label
    device_batches: dict[str, dict[int, int]] = field(default_factory=dict)  # label -> batch size -> device calls

    @property
    def inflight_bytes(self) -> int:
        """Device bytes of the admitted relays in flight (what trigger.max_inflight_bytes bounds)."""
        return self.relays.inflight_relays * self.slot_bytes

    @property
    def pending_prefills(self) -> int:
        return self.relays.pending_relays

    def counters(self) -> dict[str, int]:
        """Flat monotonic counters for diffing around a benchmark run: the work counts, `rank_<tier>`,
        `preinfer_<reason>`, `wasted_prefills`, `expired_relays` (READY relays whose rank never came) and
        `extended_events` (events computed by extensions)."""
        out = {k: v for k, v in asdict(self.work).items()}
        out.update({f"rank_{k}": v for k, v in asdict(self.ranks).items()})
        out.update({f"preinfer_{k}": v for k, v in self.preinfers.items()})
        out["wasted_prefills"] = self.relays.dropped_evicted
        out["expired_relays"] = self.relays.expired
        out["extended_events"] = self.cache.extended_tokens
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (what /v1/stats shows), with `counters()` and `pending_prefills`."""
        return {**asdict(self), "counters": self.counters(), "pending_prefills": self.pending_prefills}
