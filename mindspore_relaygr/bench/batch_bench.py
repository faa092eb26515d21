"""`relaygr bench batching`: ranks per second at saturation, with ranks batched on the device thread or not.

`--users` users each get their long prefix pre-inferred into a device slot of their own; then `--clients` threads
rank those users in a closed loop (each sends its next rank as soon as the last is answered) for `--seconds`,
once with relay.max_rank_batch = 1 and once with `--batch`, on one model (the same compiled graphs), in
alternating order for `--rounds` rounds. Every rank is served from its device slot, so the difference is the
batching alone. Reported per run: ranks per second, P50 / P99 latency, the tiers that served the ranks and the
batch sizes the device thread formed; per round, the ratio of the two throughputs.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

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


def run_batch_bench(config: RelayGRConfig, users: int, clients: int, events: int, suffix: int, candidates: int,
                    batch: int, seconds: float, rounds: int, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Both modes, alternating, `rounds` times; returns the JSON-able report."""
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
    runs = []
    for r in range(rounds):
        for max_batch in ((1, batch) if r % 2 == 0 else (batch, 1)):
            engine = _engine(config, model, latency, max_batch)
            try:
                for i, prefix in enumerate(prefixes):
                    decision = engine.preinfer(f"u{i}", prefix, num_candidates=candidates)
                    if not decision.admitted:
                        raise RuntimeError(f"the pre-infer of user {i} was not admitted ({decision.reason})")
                engine.wait_prefills(600)
                out = closed_loop(lambda k, e=engine: e.rank(f"u{k % users}", histories[k % users],
                                                               cands[k % users]).cache, clients, seconds)
                out.update(round=r, max_rank_batch=max_batch, batches=engine.executor.batch_stats().get("rank", {}))
            finally:
                engine.close()
            runs.append(out)
            progress(f"round {r + 1}/{rounds}, max_rank_batch {max_batch}: {out['ranks_per_s']:.1f} ranks/s, "
                     f"p50 {out['p50_ms']:.0f} ms, p99 {out['p99_ms']:.0f} ms, tiers {out['tiers']}, "
                     f"batch sizes {out['batches']}")
    ratios = []
    for r in range(rounds):
        by = {x["max_rank_batch"]: x for x in runs if x["round"] == r}
        ratios.append(by[batch]["ranks_per_s"] / by[1]["ranks_per_s"])
    return {"users": users, "clients": clients, "events": events, "suffix": suffix, "candidates": candidates,
            "batch": batch, "seconds": seconds, "rounds": rounds, "runs": runs, "ratios": ratios,
            "ratio_median": float(np.median(ratios)), "ratio_range": [min(ratios), max(ratios)],
            # one B-user call over B single calls per batch bucket, as calibration measured them
            "batch_factors": {str(b): f for b, f in latency.batch_factors.items()}}


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{report['users']} users x {report['events']} events, {report['candidates']} candidates, "
             f"{report['clients']} closed-loop clients, {report['seconds']:g} s per run",
             f"{'round':>5} {'batch':>5} | {'ranks/s':>8} {'p50 ms':>7} {'p99 ms':>7} | batch sizes"]
    for x in report["runs"]:
        lines.append(f"{x['round'] + 1:>5} {x['max_rank_batch']:>5} | {x['ranks_per_s']:>8.1f} {x['p50_ms']:>7.0f} "
                     f"{x['p99_ms']:>7.0f} | {x['batches']}")
    lines.append(f"ranks/s with max_rank_batch {report['batch']} over 1: median {report['ratio_median']:.2f}x, "
                 f"rounds {', '.join(f'{r:.2f}' for r in report['ratios'])}")
    if report.get("batch_factors"):
        lines.append("batch factors (one call of B users over B single calls): "
                     + ", ".join(f"B={b} {f:.2f}" for b, f in report["batch_factors"].items()))
    return "\n".join(lines)
