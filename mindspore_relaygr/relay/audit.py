"""Continuous exactness audit: which cached ranks to recompute, and what the recomputations found.

A sampled rank served from a device slot is recomputed later by full inference (at the lowest
device priority, when no rank or prefill is waiting). The max |cached - full| of each recomputation
goes into a histogram; over `TOLERANCE` (invariant R1) the engine drops the entry that served it.
Plain Python bookkeeping (thread-safe); the engine owns the device work.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

TOLERANCE = 1e-5  # R1: max abs difference of fp32 scores between the cached and the full path
# Upper bounds of the histogram buckets of max |cached - full| (+Inf is implied).
DIFF_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
MAX_PENDING = 4  # audits queued at once; a sampled rank beyond this is skipped, not queued


@dataclass(slots=True)
class AuditStats:
    """What the audit did: checks, failures (entry dropped), skips and the histogram of differences."""

    checked: int = 0
    failures: int = 0  # max |cached - full| over TOLERANCE: the entry was dropped
    skipped: int = 0  # sampled while MAX_PENDING audits were already queued
    max_abs_diff: float = 0.0
    diff_sum: float = 0.0
    diff_counts: list[int] = field(default_factory=lambda: [0] * (len(DIFF_BUCKETS) + 1))  # per bucket, +Inf last

    def histogram(self) -> list[tuple[str, int]]:
        """Cumulative (upper bound, count) pairs in Prometheus order, "+Inf" last."""
        out, total = [], 0
        for bound, count in zip([*map(repr, DIFF_BUCKETS), "+Inf"], self.diff_counts, strict=True):
            total += count
            out.append((bound, total))
        return out


class ExactnessAudit:
    """Samples `fraction` of the ranks offered to it (evenly spaced, deterministic) and records results."""

    def __init__(self, fraction: float, max_pending: int = MAX_PENDING) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction={fraction!r}: must be in [0, 1]")
        self.fraction = fraction
        self.max_pending = max_pending
        self._lock = threading.Lock()
        self._offered = 0
        self._pending = 0
        self._stats = AuditStats()

    def sample(self) -> bool:
        """Offer one cached rank: True if it should be audited (the caller then calls `finished`)."""
        with self._lock:
            self._offered += 1
            due = math.floor(self._offered * self.fraction) > math.floor((self._offered - 1) * self.fraction)
            if not due:
                return False
            if self._pending >= self.max_pending:
                self._stats.skipped += 1
                return False
            self._pending += 1
            return True

    def finished(self, max_abs_diff: float | None) -> bool:
        """A sampled audit ended with this difference (None: it could not run). True if it failed."""
        with self._lock:
            self._pending -= 1
            if max_abs_diff is None:
                self._stats.skipped += 1
                return False
            if math.isnan(max_abs_diff):
                max_abs_diff = math.inf
            s = self._stats
            s.checked += 1
            s.max_abs_diff = max(s.max_abs_diff, max_abs_diff)
            s.diff_sum += max_abs_diff
            bucket = next((i for i, b in enumerate(DIFF_BUCKETS) if max_abs_diff <= b), len(DIFF_BUCKETS))
            s.diff_counts[bucket] += 1
            failed = max_abs_diff > TOLERANCE
            s.failures += int(failed)
            return failed

    def stats(self) -> AuditStats:
        with self._lock:
            s = self._stats
            return AuditStats(s.checked, s.failures, s.skipped, s.max_abs_diff, s.diff_sum, list(s.diff_counts))
