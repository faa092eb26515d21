"""`relaygr bench batching`: ranks per second at saturation, with ranks batched on the device thread or not.

`--users` users each get their long prefix pre-inferred into a device slot of their own; then `--clients` threads
rank those users in a closed loop (each sends its next rank as soon as the last is answered) for `--seconds`,
once with relay.max_rank_batch = 1 and once with `--batch`, on one model (the same compiled graphs), in
alternating order for `--rounds` rounds. Every rank is served from its device slot, so the difference is the
batching alone. Reported per run: ranks per second, P50 / P99 latency, the tiers that served the ranks and the
batch sizes the device thread formed; per round, the ratio of the two throughputs.

Low load (`--low-qps`, 0 skips it): the same users ranked open-loop, Poisson arrivals at `--low-qps` for
`--low-requests` ranks per run, latency from each rank's scheduled arrival, both modes alternating for the same
rounds and on the same arrival sequence. Batching must not cost the lightly loaded tail: reported are each run's
P99 with its bootstrap interval, and the P99 of all batched ranks over that of all unbatched ones.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from mindspore_relaygr.bench.loadgen import run_open_loop
from mindspore_relaygr.bench.tailstats import p99_summary
from mindspore_relaygr.bench.workload import Request, Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.model.inputs import synthetic_history

# The trigger admits every pre-infer of the bench and no relay expires during it: only ranks are measured.
BENCH_TRIGGER = {"risk_margin": 1e-6, "max_queued_prefills": 1 << 20, "max_prefill_tokens_per_s": 1e12,
                 "prefill_burst_tokens": 1 << 30, "max_inflight_slots": None, "max_inflight_bytes": None}


def _engine(config: RelayGRConfig, model: Any, latency: Any, max_batch: int):
    from mindspore_relaygr.relay.engine import RelayEngine

    cfg = replace(config, trigger=replace(config.trigger, **BENCH_TRIGGER),
                  relay=replace(config.relay, max_rank_batch=max_batch, warmup=False, ready_ttl_ms=1e12))
    return RelayEngine(cfg, model, latency)


def closed_loop(rank: Callable[[int], str], clients: int, seconds: float) -> dict[str, Any]:
    """`clients` threads call rank(k) (k = their running request number, any int) back to back for `seconds`;
    the ranks answered in time, per second, with latency percentiles and the tiers `rank` returned."""
    latencies: list[float] = []
    tiers: Counter[str] = Counter()
    lock = threading.Lock()
    go = threading.Event()  # the window opens once every client thread runs
    stop_at = 0.0

    def client(i: int) -> None:
        k = i
        go.wait()
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            tier = rank(k)
            ms = (time.perf_counter() - t0) * 1e3
            with lock:
                latencies.append(ms)
                tiers[tier] += 1
            k += clients

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    stop_at = t0 + seconds
    go.set()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"ranks": len(latencies), "seconds": wall, "ranks_per_s": len(latencies) / wall,
            "p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
            "p99_ms": float(np.percentile(latencies, 99)) if latencies else None, "tiers": dict(tiers)}


def poisson_arrivals(qps: float, requests: int, users: int, seed: int = 0) -> Workload:
    """`requests` ranks with exponential gaps of mean 1/`qps` s, cycling through `users` (no pre-infer signal)."""
    if qps <= 0 or requests < 1 or users < 1:
        raise ValueError(f"qps={qps}, requests={requests}, users={users}: all must be positive")
    at = np.cumsum(np.random.default_rng(seed).exponential(1.0 / qps, requests))
    reqs = [Request(at_s=float(t), user=k % users, visit=0, gap_s=0.0, candidate_seed=k) for k, t in enumerate(at)]
    return Workload(WorkloadSpec(num_users=users, num_requests=requests, qps=qps), [0] * users, reqs)


def open_loop(rank: Callable[[int], str], workload: Workload) -> dict[str, Any]:
    """Replay `workload` (rank(user) per request, on schedule); P50, P99 with its interval, tiers, latencies."""
    outcomes = run_open_loop(workload, None, lambda req: (rank(req.user), False, 200))
    failed = [o.error for o in outcomes if not o.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(outcomes)} low-load ranks failed, e.g. {failed[0]}")
    latencies = [o.latency_ms for o in outcomes]
    return {"ranks": len(latencies), "p50_ms": float(np.percentile(latencies, 50)), **p99_summary(latencies),
            "tiers": dict(Counter(o.tier for o in outcomes)), "latencies_ms": latencies}


def _pooled_low_load(runs: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    """P99 of every low-load rank of each mode (all rounds together) and the batched / unbatched ratio."""
    pooled = {size: p99_summary([ms for x in runs if x["max_rank_batch"] == size for ms in x["latencies_ms"]])
              for size in (1, batch)}
    rounds = sorted({x["round"] for x in runs})
    by = {(x["round"], x["max_rank_batch"]): x for x in runs}
    return {"unbatched": pooled[1], "batched": pooled[batch],
            "p99_ratio": pooled[batch]["p99_ms"] / pooled[1]["p99_ms"],
            "p99_ratios": [by[r, batch]["p99_ms"] / by[r, 1]["p99_ms"] for r in rounds]}


def run_batch_bench(config: RelayGRConfig, users: int, clients: int, events: int, suffix: int, candidates: int,
                    batch: int, seconds: float, rounds: int, progress: Callable[[str], None] = print,
                    low_qps: float = 0.0, low_requests: int = 1000) -> dict[str, Any]:
    """Both modes, alternating, `rounds` times, at saturation and (`low_qps` > 0) at low load; the JSON-able
    report."""
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.relay.engine import calibrate_for_engine, warm_up_for_engine

    if users > config.cache.num_slots:
        raise ValueError(f"--users {users} exceed cache.num_slots={config.cache.num_slots}: every user needs a slot")
    model = RelayGRModel(config)
    t0 = time.perf_counter()
    warm_up_for_engine(model, config, max_rank_batch=batch)
    latency = calibrate_for_engine(model, config, max_rank_batch=batch)
    progress(f"warm-up + calibration {time.perf_counter() - t0:.0f} s")
    user_token = 1 if config.model.user_feature_sizes else 0
    histories = [synthetic_history(config.model, events - user_token, seed=i) for i in range(users)]
    prefixes = [{k: (v if k == "user_features" else v[: len(v) - suffix]) for k, v in h.items()} for h in histories]
    rng = np.random.default_rng(0)
    cands = [rng.integers(1, config.model.num_items + 1, candidates) for _ in range(users)]
    arrivals = poisson_arrivals(low_qps, low_requests, users) if low_qps > 0 else None
    runs, low_runs = [], []
    for r in range(rounds):
        for max_batch in ((1, batch) if r % 2 == 0 else (batch, 1)):
            engine = _engine(config, model, latency, max_batch)
            try:
                for i, prefix in enumerate(prefixes):
                    decision = engine.preinfer(f"u{i}", prefix, num_candidates=candidates)
                    if not decision.admitted:
                        raise RuntimeError(f"the pre-infer of user {i} was not admitted ({decision.reason})")
                engine.wait_prefills(600)
                rank = lambda k, e=engine: e.rank(f"u{k % users}", histories[k % users], cands[k % users]).cache  # noqa: E731
                out = closed_loop(rank, clients, seconds)
                out.update(round=r, max_rank_batch=max_batch, batches=engine.executor.batch_stats().get("rank", {}))
                runs.append(out)
                progress(f"round {r + 1}/{rounds}, max_rank_batch {max_batch}: {out['ranks_per_s']:.1f} ranks/s, "
                         f"p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms, tiers {out['tiers']}, "
                         f"batch sizes {out['batches']}")
                if arrivals is not None:
                    before = engine.executor.batch_stats().get("rank", {})
                    low = open_loop(rank, arrivals)
                    after = engine.executor.batch_stats().get("rank", {})
                    low.update(round=r, max_rank_batch=max_batch,
                               batches={s: n - before.get(s, 0) for s, n in after.items() if n > before.get(s, 0)})
                    low_runs.append(low)
                    progress(f"round {r + 1}/{rounds}, max_rank_batch {max_batch}, {low_qps:g} QPS open loop: "
                             f"p50 {low['p50_ms']:.0f} ms, p99 {low['p99_ms']:.0f} ms "
                             f"[{low['p99_low_ms']:.0f}, {low['p99_high_ms']:.0f}], batch sizes {low['batches']}")
            finally:
                engine.close()
    ratios = []
    for r in range(rounds):
        by = {x["max_rank_batch"]: x for x in runs if x["round"] == r}
        ratios.append(by[batch]["ranks_per_s"] / by[1]["ranks_per_s"])
    report = {"users": users, "clients": clients, "events": events, "suffix": suffix, "candidates": candidates,
              "batch": batch, "seconds": seconds, "rounds": rounds, "runs": runs, "ratios": ratios,
              "ratio_median": float(np.median(ratios)), "ratio_range": [min(ratios), max(ratios)],
              # one B-user call over B single calls per batch bucket, as calibration measured them
              "batch_factors": {str(b): f for b, f in latency.batch_factors.items()}}
    if low_runs:
        report["low_load"] = {"qps": low_qps, "requests": low_requests, "runs": low_runs,
                              **_pooled_low_load(low_runs, batch)}
    return report


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{report['users']} users x {report['events']} events, {report['candidates']} candidates, "
             f"{report['clients']} closed-loop clients, {report['seconds']:g} s per run",
             f"{'round':>5} {'batch':>5} | {'ranks/s':>8} {'p50 ms':>7} {'p99 ms':>7} | batch sizes"]
    for x in report["runs"]:
        lines.append(f"{x['round'] + 1:>5} {x['max_rank_batch']:>5} | {x['ranks_per_s']:>8.1f} {x['p50_ms']:>7.0f} "
                     f"{x['p99_ms']:>7.0f} | {x['batches']}")
    lines.append(f"ranks/s with max_rank_batch {report['batch']} over 1: median {report['ratio_median']:.2f}x, "
                 f"rounds {', '.join(f'{r:.2f}' for r in report['ratios'])}")
    low = report.get("low_load")
    if low:
        lines.append(f"low load: {low['qps']:g} QPS open loop (Poisson), {low['requests']} ranks per run")
        lines.append(f"{'round':>5} {'batch':>5} | {'p50 ms':>7} {'p99 ms [95% CI]':>20} | batch sizes")
        for x in low["runs"]:
            ci = f"{x['p99_ms']:.1f} [{x['p99_low_ms']:.1f}, {x['p99_high_ms']:.1f}]"
            lines.append(f"{x['round'] + 1:>5} {x['max_rank_batch']:>5} | {x['p50_ms']:>7.1f} {ci:>20} | "
                         f"{x['batches']}")
        b, u = low["batched"], low["unbatched"]
        lines.append(f"low-load P99, all rounds: batched {b['p99_ms']:.1f} ms [{b['p99_low_ms']:.1f}, "
                     f"{b['p99_high_ms']:.1f}] over unbatched {u['p99_ms']:.1f} ms [{u['p99_low_ms']:.1f}, "
                     f"{u['p99_high_ms']:.1f}]: {low['p99_ratio']:.3f}x (rounds "
                     f"{', '.join(f'{r:.3f}' for r in low['p99_ratios'])})")
    if report.get("batch_factors"):
        lines.append("batch factors (one call of B users over B single calls): "
                     + ", ".join(f"B={b} {f:.2f}" for b, f in report["batch_factors"].items()))
    return "\n".join(lines)
