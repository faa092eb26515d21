"""`relaygr bench engine`: relay vs baseline on the in-process engine, same model, same workload.

For each offered load the two modes run back to back (alternating which goes first, so machine
drift hits both): baseline = relay.enabled false (full inference on the most recent
relay.max_online_len events); relay = pre-infer at retrieval time, rank from the cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from mindspore_relaygr.bench.loadgen import percentile, run_open_loop, summarize
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig


def engine_for(config: RelayGRConfig, model: Any, latency: Any, relay: bool):
    from mindspore_relaygr.relay.engine import RelayEngine

    cfg = replace(config, relay=replace(config.relay, enabled=relay))
    return RelayEngine(cfg, model, latency, instance_id="relay" if relay else "baseline")


def run_one(engine: Any, workload: Workload, relay: bool, time_limit_s: float | None) -> dict[str, Any]:
    user_id = "user-{}".format

    def preinfer(req):
        res = engine.preinfer(user_id(req.user), workload.history(req), workload.spec.num_candidates)
        return res.reason, False, 202

    queue_ms: list[float] = []  # time each rank waited for the device thread (behind a chunk or other ranks)
    truncated: list[dict[str, Any]] = []  # which requests were ranked on fewer events, and on how many

    def rank(req):
        res = engine.rank(user_id(req.user), workload.history(req), workload.candidates(req), top_k=10)
        queue_ms.append(res.timings_ms["queue"])
        if res.truncated:
            truncated.append({"request": asdict(req), "ranked_events": res.ranked_events})
        return res.cache, res.truncated, 200

    call_stats = getattr(engine.model, "call_stats", None)
    if call_stats is not None:
        call_stats.reset()
    engine.executor.reset_stats()  # start-up work (e.g. measuring the copy bandwidth) is not the run's
    outcomes = run_open_loop(workload, preinfer if relay else None, rank, time_limit_s=time_limit_s)
    engine.wait_prefills(600)
    summary = summarize(outcomes, workload.spec.qps)
    # What held the device thread: the longest step per kind of work, the slowest graph calls, and
    # any graph compiled on the request path (a shape the warm-up missed).
    summary["device_steps"] = engine.executor.step_stats()
    if call_stats is not None:
        summary["slowest_graph_calls"] = call_stats.slowest(3)
        summary["cold_compiles"] = [c.as_dict() for c in call_stats.cold_calls]
    summary["rank_queue_ms"] = {"p50": percentile(queue_ms, 50), "p99": percentile(queue_ms, 99),
                                "max": max(queue_ms, default=float("nan"))}
    summary["engine"] = engine.stats().counters()
    summary["wasted_prefills"] = summary["engine"].get("wasted_prefills", 0)
    summary["truncated_requests"] = truncated
    return summary


def run_engine_bench(config: RelayGRConfig, spec: WorkloadSpec, loads: list[float], time_limit_s: float | None,
                     progress: Callable[[str], None], timeline: Any = None) -> dict[str, Any]:
    """Both modes at every load on the synthetic workload of `spec`, or on `timeline` (a
    TimelineWorkload, rescaled to each load) when given; `spec` still sets the predicted full path."""
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.relay.engine import calibrate_for_engine, warm_up_for_engine

    model = RelayGRModel(config)
    t0 = time.perf_counter()
    warm_up_for_engine(model, config, progress=progress)
    latency = calibrate_for_engine(model, config)
    progress(f"warm-up + calibration {time.perf_counter() - t0:.0f} s; predicted full path at "
             f"{spec.max_len} tokens / {spec.num_candidates} candidates: "
             f"{latency.predict_full_ms(spec.max_len, spec.num_candidates):.0f} ms")
    rows = []
    for i, qps in enumerate(loads):
        workload = timeline.with_spec(qps=qps) if timeline is not None else Workload.generate(replace(spec, qps=qps))
        for relay in ((False, True) if i % 2 == 0 else (True, False)):
            engine = engine_for(config, model, latency, relay)
            try:
                summary = run_one(engine, workload, relay, time_limit_s)
            finally:
                engine.close()
            summary["mode"] = "relay" if relay else "baseline"
            rows.append(summary)
            progress(f"{qps:g} QPS {summary['mode']:>8}: p50 {summary['p50_ms']:.0f} ms, p99 {summary['p99_ms']:.0f} "
                     f"ms, hit rate {summary['hit_rate']:.2f}, truncated {summary['truncations']}, "
                     f"errors {summary['errors']}; longest device step {longest_step(summary)}")
    chunk = config.trigger.prefill_chunk_len
    source = {"timeline": {**timeline.spec.__dict__, **timeline.describe()}} if timeline is not None else {}
    return {"spec": spec.__dict__, **source, "slo_ms": config.trigger.slo_ms,
            "max_online_len": config.relay.max_online_len, "prefill_chunk_len": chunk,
            # The bound a rank's device-queue wait should respect: one prefill chunk (plus ranks ahead).
            "longest_chunk_ms": max(latency.predict_prefill_chunks_ms(spec.max_len, chunk)),
            "results": rows}


def longest_step(summary: dict[str, Any]) -> str:
    """'label N ms' of the longest single step the device thread ran in a run."""
    steps = summary.get("device_steps") or {}
    if not steps:
        return "-"
    label, row = max(steps.items(), key=lambda kv: kv[1]["max_ms"])
    return f"{label} {row['max_ms']:.0f} ms"


def format_table(report: dict[str, Any]) -> str:
    head = (f"{'QPS':>5} {'mode':>8} | {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} | {'queue max':>9} | "
            f"{'longest device step':>22} | "
            f"{'achieved':>8} | {'hit rate':>8} {'truncated':>9} {'errors':>6} | tiers / trigger")
    lines = [f"SLO {report['slo_ms']:g} ms, baseline cap {report['max_online_len']} events; longest prefill chunk "
             f"({report['prefill_chunk_len']} tokens) predicted {report['longest_chunk_ms']:.0f} ms: a rank's "
             f"device-queue wait ('queue max') should stay within about one chunk plus the ranks ahead of it",
             head, "-" * len(head)]
    for r in report["results"]:
        extra = dict(r["tiers"])
        extra.update({f"t:{k}": v for k, v in r["trigger"].items()})
        lines.append(f"{r['offered_qps']:>5g} {r['mode']:>8} | {r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} "
                     f"{r['max_ms']:>7.0f} | {r['rank_queue_ms']['max']:>9.0f} | {longest_step(r):>22} | "
                     f"{r['achieved_qps']:>8.2f} | {r['hit_rate']:>8.2f} {r['truncations']:>9} {r['errors']:>6} | "
                     f"{extra}")
    return "\n".join(lines)
