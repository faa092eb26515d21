"""Sequence-aware trigger: which pre-infer signals get a relay, decided from cheap metadata.

A relay is admitted iff, in this order:
  1. its key is not already cached (`already_cached`) nor being pre-inferred (`inflight`);
  2. it is at risk: predicted full-path latency > slo_ms * risk_margin, and the prefix has at
     least min_prefix_len tokens (`not_at_risk`);
  3. one more relay keeps the in-flight footprint (admitted relays neither consumed nor dropped:
     RESERVED + READY-unconsumed) within max_inflight_slots and max_inflight_bytes (`footprint`);
  4. the pre-infer load allows it (`load`): fewer than max_queued_prefills prefills pending, and
     a token bucket (rate max_prefill_tokens_per_s, depth prefill_burst_tokens) holds the prefix's
     tokens. A prefix longer than the depth is admitted from a full bucket and leaves it in debt,
     so the long-run rate still holds.

`decide` accounts an admitted relay itself (under the same lock as the checks, so concurrent
callers never overshoot a bound); the engine reports the rest of its life with `on_ready`,
`on_consumed` and `on_dropped`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mindspore_relaygr.config import TriggerConfig
from mindspore_relaygr.relay.latency import LatencyModel

logger = logging.getLogger(__name__)

REASONS = ("admitted", "not_at_risk", "footprint", "load", "already_cached", "inflight")


@dataclass(frozen=True)
class TriggerDecision:
    admitted: bool
    reason: str  # one of REASONS
    predicted_full_ms: float


class SequenceAwareTrigger:
    """Admission control of pre-infers; thread-safe (one lock)."""

    def __init__(
        self,
        cfg: TriggerConfig,
        latency: LatencyModel,
        slot_bytes: int,
        num_slots: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slot_bytes <= 0:
            raise ValueError(f"slot_bytes={slot_bytes!r}: must be > 0")
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots!r}: must be >= 1")
        if cfg.max_inflight_bytes is not None and cfg.max_inflight_bytes < slot_bytes:
            raise ValueError(
                f"trigger.max_inflight_bytes={cfg.max_inflight_bytes!r}: smaller than one slot "
                f"({slot_bytes} bytes), no relay could ever be admitted"
            )
        self.cfg = cfg
        self.latency = latency
        self.slot_bytes = slot_bytes
        self.budget_ms = cfg.slo_ms * cfg.risk_margin
        self.max_inflight_slots = min(cfg.max_inflight_slots or num_slots, num_slots)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(cfg.prefill_burst_tokens)
        self._last_refill = clock()
        self._inflight = 0  # admitted, not yet consumed or dropped
        self._pending = 0  # admitted, prefill not yet finished (queued or running)
        self._counts = dict.fromkeys(REASONS, 0)

    def decide(
        self, prefix_len: int, num_candidates: int, already_cached: bool = False, inflight: bool = False
    ) -> TriggerDecision:
        """Admit or refuse a pre-infer of `prefix_len` tokens; an admitted one is accounted in flight."""
        predicted = self.latency.predict_full_ms(prefix_len, num_candidates)  # validates both
        with self._lock:
            reason = self._reason(prefix_len, predicted, already_cached, inflight)
            self._counts[reason] += 1
            if reason == "admitted":
                self._tokens -= prefix_len
                self._inflight += 1
                self._pending += 1
        logger.debug(
            "trigger prefix_len=%d candidates=%d predicted=%.2fms: %s", prefix_len, num_candidates, predicted, reason
        )
        return TriggerDecision(reason == "admitted", reason, predicted)

    def _reason(self, prefix_len: int, predicted_ms: float, already_cached: bool, inflight: bool) -> str:
        if already_cached:
            return "already_cached"
        if inflight:
            return "inflight"
        if prefix_len < self.cfg.min_prefix_len or predicted_ms <= self.budget_ms:
            return "not_at_risk"
        max_bytes = self.cfg.max_inflight_bytes
        if self._inflight + 1 > self.max_inflight_slots or (
            max_bytes is not None and (self._inflight + 1) * self.slot_bytes > max_bytes
        ):
            return "footprint"
        self._refill()
        if self._pending >= self.cfg.max_queued_prefills:
            return "load"
        if self._tokens < min(prefix_len, self.cfg.prefill_burst_tokens):
            return "load"
        return "admitted"

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last_refill)
        self._last_refill = now
        self._tokens = min(
            float(self.cfg.prefill_burst_tokens), self._tokens + elapsed * self.cfg.max_prefill_tokens_per_s
        )

    # ---- lifecycle reports from the engine ----

    def on_ready(self) -> None:
        """The prefill of an admitted relay finished (RESERVED -> READY); it no longer counts as queued."""
        with self._lock:
            if self._pending < 1:
                raise RuntimeError(f"on_ready() with no prefill pending ({self._state()})")
            self._pending -= 1

    def on_consumed(self) -> None:
        """A rank consumed a READY relay (call once per relay); it leaves the footprint."""
        with self._lock:
            if self._inflight - self._pending < 1:
                raise RuntimeError(f"on_consumed() with no READY relay in flight ({self._state()})")
            self._inflight -= 1

    def on_dropped(self, ready: bool) -> None:
        """An admitted relay was abandoned (prefill failed, no slot, evicted before use)."""
        with self._lock:
            if self._inflight < 1 or (not ready and self._pending < 1) or (ready and self._inflight == self._pending):
                raise RuntimeError(f"on_dropped(ready={ready}) does not match the state ({self._state()})")
            self._inflight -= 1
            if not ready:
                self._pending -= 1

    # ---- introspection ----

    def counts(self) -> dict[str, int]:
        """Number of decisions per reason (every reason present)."""
        with self._lock:
            return dict(self._counts)

    def state(self) -> dict[str, float]:
        """In-flight relays and bytes, pending prefills and the token bucket level."""
        with self._lock:
            self._refill()
            return self._state()

    def _state(self) -> dict[str, float]:
        return {
            "inflight_slots": self._inflight,
            "inflight_bytes": self._inflight * self.slot_bytes,
            "queued_prefills": self._pending,
            "bucket_tokens": self._tokens,
        }
