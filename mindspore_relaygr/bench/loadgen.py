"""Open-loop load: every pre-infer and rank is sent on its schedule, whether or not earlier ones
finished, so queueing shows in the tail. Latency is measured from the scheduled send time.
Bounded by the workload's request count and an optional time limit."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindspore_relaygr.bench.tailstats import p99_summary
from mindspore_relaygr.bench.workload import Request, Workload


@dataclass(frozen=True)
class Outcome:
    kind: str  # preinfer | rank
    user: int
    scheduled_s: float
    latency_ms: float
    ok: bool
    tier: str = ""  # rank: cache tier; preinfer: trigger reason
    truncated: bool = False
    status: int = 200  # HTTP-style status (503 = rejected)
    error: str = ""


Sender = Callable[[Request], tuple[str, bool, int]]  # -> (tier or reason, truncated, status)


def run_open_loop(workload: Workload, send_preinfer: Sender | None, send_rank: Sender, max_workers: int = 32,
                  time_limit_s: float | None = None, clock: Callable[[], float] = time.perf_counter,
                  sleep: Callable[[float], None] = time.sleep) -> list[Outcome]:
    """Replay the workload on schedule from a pool of `max_workers` threads (`clock` and `sleep` in seconds)."""
    events = [(r.at_s + r.gap_s, "rank", r) for r in workload.requests]
    if send_preinfer is not None:
        events += [(r.at_s, "preinfer", r) for r in workload.requests]
    events.sort(key=lambda e: (e[0], e[1] == "rank"))
    start = clock()

    def call(kind: str, req: Request, scheduled: float) -> Outcome:
        fn = send_rank if kind == "rank" else send_preinfer
        try:
            tier, truncated, status = fn(req)
            ok, error = status < 400, ""
        except Exception as exc:  # noqa: BLE001 - recorded as an error outcome
            tier, truncated, status, ok, error = "", False, 599, False, f"{type(exc).__name__}: {exc}"
        latency = (clock() - scheduled) * 1e3
        return Outcome(kind, req.user, scheduled - start, latency, ok, tier, truncated, status, error)

    futures = []
    with ThreadPoolExecutor(max_workers) as pool:
        for at_s, kind, req in events:
            if time_limit_s is not None and at_s > time_limit_s:
                break
            scheduled = start + at_s
            delay = scheduled - clock()
            if delay > 0:
                sleep(delay)
            futures.append(pool.submit(call, kind, req, scheduled))
    return [f.result() for f in futures]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(outcomes: list[Outcome], offered_qps: float) -> dict[str, Any]:
    """Latency percentiles of ranks (all, and per cache tier), achieved QPS, errors, tiers and trigger reasons."""
    ranks = [o for o in outcomes if o.kind == "rank"]
    good = [o.latency_ms for o in ranks if o.ok]
    span = max((o.scheduled_s + o.latency_ms / 1e3 for o in ranks), default=0.0) - min(
        (o.scheduled_s for o in ranks), default=0.0)
    tiers = Counter(o.tier for o in ranks if o.ok)
    return {
        "offered_qps": offered_qps,
        "achieved_qps": len(good) / span if span > 0 else float("nan"),
        "ranks": len(ranks),
        "errors": sum(1 for o in ranks if not o.ok and o.status != 503),
        "rejected_503": sum(1 for o in ranks if o.status == 503),
        "p50_ms": percentile(good, 50), "p90_ms": percentile(good, 90),
        **p99_summary(good),  # p99_ms with its bootstrap interval p99_low_ms .. p99_high_ms
        "max_ms": max(good, default=float("nan")),
        "tiers": dict(tiers),
        "hit_rate": sum(tiers[k] for k in ("device", "dram", "inflight", "partial")) / max(len(good), 1),
        "truncations": sum(1 for o in ranks if o.truncated),
        "trigger": dict(Counter(o.tier for o in outcomes if o.kind == "preinfer")),
        "tier_latency_ms": {tier: {"p50": percentile(ms, 50), "p99": percentile(ms, 99), "max": max(ms)}
                            for tier, ms in _latency_by_tier(ranks).items()},
    }


def _latency_by_tier(ranks: list[Outcome]) -> dict[str, list[float]]:
    by_tier: dict[str, list[float]] = {}
    for o in ranks:
        if o.ok:
            by_tier.setdefault(o.tier, []).append(o.latency_ms)
    return by_tier
