"""Admission control of ranking requests: admit a rank only if it can still finish inside the SLO.

A rank is admitted when the work ahead of it, plus its own, is predicted to drain within
`budget_ms`; otherwise it is refused at once (the HTTP layer answers 503 + Retry-After, and nginx
tries the next instance). The decision is taken when the request enters the server, before its body
is parsed, and counts every admitted rank that has not finished, wherever it is: parsing, waiting
for an in-flight prefill, queued on the device thread or computing. Nothing waits where it is not
counted, so the view stays accurate however many server threads there are.

The cost of one rank is learned from departures, not predicted from its shape: while the server is
busy, the time between two consecutive completions is the time the server needs per rank, whatever
the bottleneck is (device thread, interpreter lock, JSON). Its exponentially weighted mean is the
per-rank cost, so a request arriving behind `n` unfinished ranks is predicted to finish after
`(n + 1) * cost`. Plain Python, thread-safe, no MindSpore.

The budget is a fraction of the SLO so that a refused rank still has time to be served by the next
instance. A rank that reached its last instance (every other one refused it) has no next one:
refusing it fails the request, so it is measured against the looser `last_resort_budget_ms` (serving
sets relay.last_try_factor x the SLO): served late rather than failed, within a bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionSnapshot:
    """Counters and the current view of the queue (for /v1/stats and /metrics)."""

    budget_ms: float
    last_resort_budget_ms: float
    in_flight: int
    cost_ms: float
    admitted: int
    rejected: int
    admitted_last_resort: int  # admitted against last_resort_budget_ms, over budget_ms

    @property
    def work_ahead_ms(self) -> float:
        return self.in_flight * self.cost_ms

    def to_dict(self) -> dict[str, float | int]:
        return {"budget_ms": self.budget_ms, "last_resort_budget_ms": self.last_resort_budget_ms,
                "in_flight": self.in_flight, "cost_ms": self.cost_ms, "work_ahead_ms": self.work_ahead_ms,
                "admitted": self.admitted, "rejected": self.rejected,
                "admitted_last_resort": self.admitted_last_resort}


class AdmissionControl:
    """Admit a rank iff (unfinished admitted ranks + 1) x the learned per-rank cost <= budget_ms.

    An idle instance admits any rank: refusing it could not make it faster anywhere. A rank on its
    last try (`try_admit(last_resort=True)`) is held to `last_resort_budget_ms` instead (default:
    budget_ms)."""

    def __init__(self, budget_ms: float, initial_cost_ms: float, smoothing: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter, last_resort_budget_ms: float | None = None) -> None:
        last_resort_budget_ms = budget_ms if last_resort_budget_ms is None else last_resort_budget_ms
        if budget_ms <= 0 or initial_cost_ms <= 0:
            raise ValueError(f"budget_ms and initial_cost_ms must be > 0, got {budget_ms}, {initial_cost_ms}")
        if last_resort_budget_ms < budget_ms:
            raise ValueError(f"last_resort_budget_ms ({last_resort_budget_ms}) must be >= budget_ms ({budget_ms})")
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.budget_ms = budget_ms
        self.last_resort_budget_ms = last_resort_budget_ms
        self._cost_ms = initial_cost_ms
        self._smoothing = smoothing
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight = 0
        self._admitted = 0
        self._rejected = 0
        self._admitted_last_resort = 0
        self._busy_since: float | None = None  # last departure, or the start of the current busy period

    def try_admit(self, last_resort: bool = False) -> bool:
        """True (and the rank counts as in flight until `finish`) if it is predicted to meet the budget:
        budget_ms, or last_resort_budget_ms for a rank that no other instance will be asked to serve."""
        with self._lock:
            predicted_ms = (self._in_flight + 1) * self._cost_ms
            budget_ms = self.last_resort_budget_ms if last_resort else self.budget_ms
            if self._in_flight > 0 and predicted_ms > budget_ms:
                self._rejected += 1
                return False
            if self._in_flight > 0 and predicted_ms > self.budget_ms:
                self._admitted_last_resort += 1
            if self._in_flight == 0:
                self._busy_since = self._clock()
            self._in_flight += 1
            self._admitted += 1
            return True

    def finish(self, served: bool = True) -> None:
        """An admitted rank left the server. A served one teaches the per-rank cost; one refused before
        it reached the model (a 400, say) only leaves the queue, so bad requests cannot lower the cost."""
        with self._lock:
            if self._in_flight <= 0:
                raise RuntimeError("finish() without an admitted rank")
            now = self._clock()
            if served and self._busy_since is not None:
                sample_ms = (now - self._busy_since) * 1e3
                self._cost_ms += self._smoothing * (sample_ms - self._cost_ms)
                self._busy_since = now
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_since = None

    def snapshot(self) -> AdmissionSnapshot:
        with self._lock:
            return AdmissionSnapshot(self.budget_ms, self.last_resort_budget_ms, self._in_flight, self._cost_ms,
                                     self._admitted, self._rejected, self._admitted_last_resort)
