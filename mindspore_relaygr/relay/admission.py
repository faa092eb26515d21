"""Admission control of ranking requests: admit a rank only if it can still finish inside the SLO.

A rank is admitted when the work ahead of it, plus its own, is predicted to drain within
`budget_ms`; otherwise it is refused at once (the HTTP layer answers 503 + Retry-After, and nginx
tries the next instance). The decision is taken once the request is read and validated, before it
reaches the engine, and counts every admitted rank that has not finished, wherever it is: waiting
for an in-flight prefill, queued on the device thread or computing. Nothing waits where it is not
counted, so the view stays accurate however many server threads there are.

Work is counted in units of request size (serving passes the rank's device time predicted by the
engine's latency model, so a long history weighs more than a short one and a cached one less), and
what a unit costs is learned from departures: while the server is busy, the time between two
consecutive completions, divided by the size of the rank that completed, is the time per unit,
whatever the bottleneck is (device thread, interpreter lock, JSON, a neighbour on the same cores).
Its exponentially weighted mean is the unit cost. It is fitted on rank service time only: the time the
server reports spending on anything else meanwhile (`spent_elsewhere`: a refusal, a bad request, a
scrape, each measured as its handler thread's CPU time) is taken out of that spacing first. Without
that, clients that resend a refused rank at once make every departure look slow, the cost rises
tenfold and the instance admits one rank at a time. The work ahead is what remains of it: the ranks in
flight have been served since the last departure (or since the busy period began), so that time is
taken off their `W * cost`, up to the mean size `m = W * cost / n` of one of the `n` of them (only the
rank in service has started). A rank in service past `m` is running late, and a late rank is taken to
need as long again as it has overrun: the credit falls back from `m` by the overrun, to nothing at
`2 m`, so a stalled rank does not let others in as if it had finished. A request of size `s` arriving
`e` ms after the last departure is predicted to finish after `W * cost - credit(e) + s * cost`, with
`credit(e) = e` up to `m` and `max(2 m - e, 0)` beyond. Without that credit a rank arriving just
before the one in service finishes would be judged as if that one had just begun: an instance whose
ranks each take more than half the budget would admit one at a time and idle between them. With
every size 1 this counts ranks. When the device thread batches ranks (relay.max_rank_batch), `n` queued
ranks cost `share(n)` of their single calls (`relay.batching.queue_share`, from the batch factors the latency
model measured per batch bucket): the work ahead is then `(W + s) * cost * share(n + 1)`, and a departure's
spacing is divided by `share(n)` before it teaches the unit cost, so a batch that departs at once teaches
the same cost as the single ranks it replaced. The time with at least one rank in flight is summed (`busy_s`): ranks
served per busy second is the instance's capacity, whether or not its clients kept it busy. Plain
Python, thread-safe, no MindSpore.

The budget is a fraction of the SLO so that a refused rank still has time to be served by the next
instance. A rank that reached its last instance (every other one refused it) has no next one:
refusing it fails the request, so it is measured against the looser `last_resort_budget_ms` (serving
sets relay.last_try_factor x the SLO): served late rather than failed, within a bound.

`refuse_early` takes the decision before the request is read, where the queue alone decides: when the
work ahead alone is over the budget, or the rank is the retry of one refused with its key (the affinity
header: a client resends the same rank) and that size still does not fit. The server then answers 503
without reading or parsing the body, so clients that resend at once cost it next to nothing. A key's
size is remembered from its last refusal until it is admitted (at most MAX_REMEMBERED keys); a smaller
rank of the same user is held to it until the queue has room for the remembered one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

ADMIT, LAST_RESORT, REFUSE = "admit", "last_resort", "refuse"
RESENT, QUEUE_FULL = "resent", "queue_full"  # why `refuse_early` refused
MAX_REMEMBERED = 4096  # keys whose refused size is kept for `refuse_early`


@dataclass(frozen=True)
class AdmissionSnapshot:
    """Counters and the current view of the queue (for /v1/stats and /metrics)."""

    budget_ms: float
    last_resort_budget_ms: float
    in_flight: int
    work: float  # sizes of the ranks in flight
    cost_ms: float  # per unit of size
    served_ms: float  # of the work in flight, the part already served (since the last departure)
    admitted: int
    rejected: int
    admitted_last_resort: int  # admitted against last_resort_budget_ms, over budget_ms
    served: int  # admitted ranks that left served (not refused before the model)
    busy_s: float  # seconds with at least one admitted rank in flight, since start
    queue_share: float = 1.0  # device time of the ranks in flight as a share of their single calls (batching)

    @property
    def work_ahead_ms(self) -> float:
        """Predicted time until the ranks in flight have all left."""
        return self.work * self.cost_ms * self.queue_share - self.served_ms

    def to_dict(self) -> dict[str, float | int]:
        return {"budget_ms": self.budget_ms, "last_resort_budget_ms": self.last_resort_budget_ms,
                "in_flight": self.in_flight, "work": self.work, "cost_ms": self.cost_ms,
                "served_ms": self.served_ms, "work_ahead_ms": self.work_ahead_ms,
                "admitted": self.admitted, "rejected": self.rejected,
                "admitted_last_resort": self.admitted_last_resort,
                "served": self.served, "busy_s": self.busy_s, "queue_share": self.queue_share}


class AdmissionControl:
    """Admit a rank iff what remains of the unfinished admitted ranks' work plus its own, at the learned unit
    cost, fits the budget.

    An idle instance admits any rank: refusing it could not make it faster anywhere. A rank on its
    last try (`try_admit(last_resort=True)`) is held to `last_resort_budget_ms` instead (default:
    budget_ms)."""

    def __init__(self, budget_ms: float, initial_cost_ms: float, smoothing: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter, last_resort_budget_ms: float | None = None,
                 queue_share: Callable[[int], float] | None = None) -> None:
        """`queue_share(n)`: device time of n queued ranks as a share of their single calls (batching);
        None: 1 (every rank runs on its own)."""
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
        self._work = 0.0  # sum of the sizes in flight
        self._admitted = 0
        self._rejected = 0
        self._admitted_last_resort = 0
        self._busy_since: float | None = None  # last departure, or the start of the current busy period
        self._period_start: float | None = None  # start of the current busy period
        self._busy_s = 0.0  # length of the busy periods that ended
        self._served = 0
        self._elsewhere_ms = 0.0  # time spent on other requests since the last departure (or busy start)
        self._refused_sizes: OrderedDict[str, float] = OrderedDict()  # key -> size of its last refusal
        self._queue_share = queue_share

    def try_admit(self, last_resort: bool | Callable[[], bool] = False, size: float = 1.0,
                  key: str | None = None) -> bool:
        """True (and the rank counts as in flight until `finish(size=...)`) if it is predicted to meet the
        budget: budget_ms, or last_resort_budget_ms for a rank that no other instance will be asked to serve.
        `last_resort` may be a function: it is called only when budget_ms alone would refuse the rank. A
        refused rank's size is remembered under `key` for `refuse_early`."""
        if not size > 0:
            raise ValueError(f"size={size!r}: must be > 0")
        with self._lock:
            verdict = self._verdict_locked(size, last_resort)
            if verdict == REFUSE:
                self._rejected += 1
                if key is not None:
                    self._remember_locked(key, size)
                return False
            if key is not None:
                self._refused_sizes.pop(key, None)
            if verdict == LAST_RESORT:
                self._admitted_last_resort += 1
            if self._in_flight == 0:
                self._busy_since = self._period_start = self._clock()
                self._elsewhere_ms = 0.0
            self._in_flight += 1
            self._work += size
            self._admitted += 1
            return True

    def refuse_early(self, key: str | None = None, last_resort: bool | Callable[[], bool] = False) -> str | None:
        """Why a rank is refused before its size is known (counted as a refusal): RESENT, `key` was refused
        before and its last size still does not fit; QUEUE_FULL, the work ahead alone is over the budget.
        None says nothing about the rank: `try_admit` decides once its size is known."""
        with self._lock:
            size = self._refused_sizes.get(key) if key is not None else None
            if self._in_flight == 0 or self._verdict_locked(size or 0.0, last_resort) != REFUSE:
                return None
            self._rejected += 1
            return QUEUE_FULL if size is None else RESENT

    def _remember_locked(self, key: str, size: float) -> None:
        self._refused_sizes[key] = size
        self._refused_sizes.move_to_end(key)
        if len(self._refused_sizes) > MAX_REMEMBERED:
            self._refused_sizes.popitem(last=False)

    def spent_elsewhere(self, ms: float) -> None:
        """The server spent `ms` on something other than a served rank (a refusal, a bad request, another
        endpoint): while ranks are in flight it is taken out of the spacing of the next departure."""
        with self._lock:
            if self._in_flight > 0 and ms > 0:
                self._elsewhere_ms += ms

    def _verdict_locked(self, size: float, last_resort: bool | Callable[[], bool]) -> str:
        """ADMIT, LAST_RESORT (over budget_ms, within last_resort_budget_ms, on its last try) or REFUSE."""
        share = self._share(self._in_flight + 1)
        predicted_ms = (self._work + size) * self._cost_ms * share - self._served_ms_locked()
        if self._in_flight == 0 or predicted_ms <= self.budget_ms:
            return ADMIT
        on_last_try = last_resort() if callable(last_resort) else last_resort
        return LAST_RESORT if on_last_try and predicted_ms <= self.last_resort_budget_ms else REFUSE

    def finish(self, served: bool = True, size: float = 1.0) -> None:
        """An admitted rank (of the `size` it was admitted with) left the server. A served one teaches the
        unit cost; one refused before it reached the model (a 400, say) only leaves the queue, so bad
        requests cannot lower the cost."""
        with self._lock:
            if self._in_flight <= 0:
                raise RuntimeError("finish() without an admitted rank")
            now = self._clock()
            if served:
                self._served += 1
                if self._busy_since is not None:
                    spacing_ms = max((now - self._busy_since) * 1e3 - self._elsewhere_ms, 0.0)
                    unit_ms = spacing_ms / (size * self._share(self._in_flight))
                    self._cost_ms += self._smoothing * (unit_ms - self._cost_ms)
                    self._busy_since = now
                    self._elsewhere_ms = 0.0
            self._in_flight -= 1
            self._work = max(self._work - size, 0.0)
            if self._in_flight == 0:
                self._work = 0.0
                self._busy_s += now - self._period_start
                self._busy_since = self._period_start = None

    def _share(self, queued: int) -> float:
        return 1.0 if self._queue_share is None or queued < 2 else self._queue_share(queued)

    def _served_ms_locked(self) -> float:
        """Work done on the ranks in flight: the time since the last departure up to one mean rank; past
        that, the rank in service is late and the credit shrinks by its overrun."""
        if self._busy_since is None or self._in_flight == 0:
            return 0.0
        elapsed_ms = (self._clock() - self._busy_since) * 1e3
        mean_rank_ms = self._work * self._cost_ms * self._share(self._in_flight) / self._in_flight
        return elapsed_ms if elapsed_ms <= mean_rank_ms else max(2 * mean_rank_ms - elapsed_ms, 0.0)

    def snapshot(self) -> AdmissionSnapshot:
        with self._lock:
            busy_s = self._busy_s + (self._clock() - self._period_start if self._period_start is not None else 0.0)
            return AdmissionSnapshot(self.budget_ms, self.last_resort_budget_ms, self._in_flight, self._work,
                                     self._cost_ms, self._served_ms_locked(), self._admitted, self._rejected,
                                     self._admitted_last_resort, self._served, busy_s, self._share(self._in_flight))
