"""Sequence-aware trigger: which pre-infer signals get a relay, decided from cheap metadata.

A relay is admitted iff, in this order:
  1. its key is not already cached (`already_cached`) nor being pre-inferred (`inflight`);
  2. a slot can hold it (`too_long`: more tokens than a slot's max_prefix_len, refused before it costs anything);
  3. it is at risk: predicted full-path latency > slo_ms * risk_margin, and the prefix has at
     least min_prefix_len events, the user token not counted (`not_at_risk`);
  4. one more relay keeps the in-flight footprint (admitted relays neither consumed nor dropped,
     as counted by the RelayLedger) within max_inflight_slots and max_inflight_bytes (`footprint`);
  5. the pre-infer load allows it (`load`): fewer than max_queued_prefills prefills pending, and
     a token bucket (rate max_prefill_tokens_per_s, depth prefill_burst_tokens) holds the prefix's
     tokens. A prefix longer than the depth is admitted from a full bucket and leaves it in debt,
     so the long-run rate still holds.

The trigger is policy only: the footprint comes from the ledger (the caller holds the ledger's lock
across `decide` and the admission, so concurrent callers never overshoot a bound); the trigger owns
its decision counts and the token bucket, which an admission debits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mindspore_relaygr.config import TriggerConfig
from mindspore_relaygr.relay.latency import LatencyModel
from mindspore_relaygr.relay.ledger import Footprint

logger = logging.getLogger(__name__)

REASONS = ("admitted", "not_at_risk", "footprint", "load", "already_cached", "inflight", "too_long")


@dataclass(frozen=True)
class TriggerStats:
    decisions: dict[str, int]  # per reason, every reason present
    bucket_tokens: float


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
        user_tokens: int = 0,
        slot_tokens: int | None = None,
    ) -> None:
        """`user_tokens`: tokens every prefix carries besides its events (the user token, 0 or 1);
        `slot_tokens`: the most tokens a slot holds (None: no limit)."""
        if slot_bytes <= 0:
            raise ValueError(f"slot_bytes={slot_bytes!r}: must be > 0")
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots!r}: must be >= 1")
        if user_tokens < 0:
            raise ValueError(f"user_tokens={user_tokens!r}: must be >= 0")
        if cfg.max_inflight_bytes is not None and cfg.max_inflight_bytes < slot_bytes:
            raise ValueError(
                f"trigger.max_inflight_bytes={cfg.max_inflight_bytes!r}: smaller than one slot "
                f"({slot_bytes} bytes), no relay could ever be admitted"
            )
        self.cfg = cfg
        self.latency = latency
        self.slot_bytes = slot_bytes
        self.user_tokens = user_tokens
        self.slot_tokens = slot_tokens
        self.budget_ms = cfg.slo_ms * cfg.risk_margin
        self.max_inflight_slots = min(cfg.max_inflight_slots or num_slots, num_slots)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(cfg.prefill_burst_tokens)
        self._last_refill = clock()
        self._counts = dict.fromkeys(REASONS, 0)

    def decide(self, prefix_len: int, num_candidates: int, footprint: Footprint,
               already_cached: bool = False, inflight: bool = False,
               extension_tokens: int | None = None) -> TriggerDecision:
        """Admit or refuse a pre-infer of `prefix_len` tokens given the relays now in flight; an
        admission debits the token bucket (the caller records the relay in the ledger).
        `extension_tokens`: the relay extends a cached prefix by only these tokens in its own slot, so
        it needs no new slot (no footprint check) and costs only them in the bucket."""
        predicted = self.latency.predict_full_ms(prefix_len, num_candidates)  # validates both
        work = prefix_len if extension_tokens is None else extension_tokens
        with self._lock:
            reason = self._reason(prefix_len, work, predicted, footprint, already_cached, inflight,
                                  new_slot=extension_tokens is None)
            self._counts[reason] += 1
            if reason == "admitted":
                self._tokens -= work
        logger.debug(
            "trigger prefix_len=%d candidates=%d predicted=%.2fms: %s", prefix_len, num_candidates, predicted, reason
        )
        return TriggerDecision(reason == "admitted", reason, predicted)

    def _reason(self, prefix_len: int, work: int, predicted_ms: float, footprint: Footprint,
                already_cached: bool, inflight: bool, new_slot: bool) -> str:
        if already_cached:
            return "already_cached"
        if inflight:
            return "inflight"
        if new_slot and self.slot_tokens is not None and prefix_len > self.slot_tokens:
            return "too_long"
        if prefix_len - self.user_tokens < self.cfg.min_prefix_len or predicted_ms <= self.budget_ms:
            return "not_at_risk"
        max_bytes = self.cfg.max_inflight_bytes
        if new_slot and (footprint.inflight + 1 > self.max_inflight_slots or (
            max_bytes is not None and (footprint.inflight + 1) * self.slot_bytes > max_bytes
        )):
            return "footprint"
        self._refill()
        if footprint.pending >= self.cfg.max_queued_prefills:
            return "load"
        if self._tokens < min(work, self.cfg.prefill_burst_tokens):
            return "load"
        return "admitted"

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._last_refill)
        self._last_refill = now
        self._tokens = min(
            float(self.cfg.prefill_burst_tokens), self._tokens + elapsed * self.cfg.max_prefill_tokens_per_s
        )

    # ---- introspection ----

    def counts(self) -> dict[str, int]:
        """Number of decisions per reason (every reason present)."""
        with self._lock:
            return dict(self._counts)

    def stats(self) -> TriggerStats:
        """Decisions per reason and the token bucket level."""
        with self._lock:
            self._refill()
            return TriggerStats(dict(self._counts), self._tokens)
