"""The paper's headline experiments, relay vs baseline side by side in one run (in-process engine).

* SLO-compliant throughput: sweep the offered QPS; a mode complies at a load if its ranking P99
  <= SLO with no errors; its SLO-compliant throughput is the highest complying load.
* Longest sequence: at a fixed load, sweep the history length; report the longest length each
  mode ranks with P99 <= SLO.
Baseline = full inference of the request's history on the ranking path (relay disabled), capped at
the length under test; relay = pre-infer at retrieval time, rank from the cache. The two modes of
each point run back to back, alternating which goes first, on one model and one workload.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mindspore_relaygr.bench.engine_bench import engine_for, longest_step, run_one
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig

Progress = Callable[[str], None]
ABLATIONS = ("full", "no_trigger", "no_expander")
SLO_FACTOR = 2.0  # the budget leaves the full path at the production cap as much again for queueing
CAP_CALLS = 40  # unloaded full-path calls at the cap behind the derived budget
SLO_SCALES = (0.6, 0.8, 1.0, 1.25, 1.5, 2.0)  # budgets around the run's SLO in the sensitivity table


def derive_slo_ms(full_ms: float, factor: float = SLO_FACTOR, step_ms: float = 5.0) -> float:
    """The default ranking budget: `factor` x the (unloaded) full-path latency `full_ms` of a request
    at the production length cap, rounded up to `step_ms`.

    The budget then follows the machine and the model: a faster full path gives a tighter budget
    instead of a stale constant that every length fits."""
    if factor <= 0 or step_ms <= 0:
        raise ValueError(f"factor={factor}, step_ms={step_ms}: both must be > 0")
    if not full_ms > 0:
        raise ValueError(f"full_ms={full_ms}: must be > 0")
    return math.ceil(factor * full_ms / step_ms) * step_ms


def time_full_path(model: Any, num_events: int, num_candidates: int, calls: int = CAP_CALLS,
                   pause_s: float = 0.05) -> dict[str, float]:
    """Median / p90 / max of `calls` unloaded `rank_full` calls on one `num_events`-event history.

    The short pause between calls keeps them unloaded (back to back they measure a hot loop); the
    median of many calls, unlike the three-call median of the latency profile, does not move with
    one slow or fast call."""
    import numpy as np

    from mindspore_relaygr.model.inputs import synthetic_history

    if calls < 1:
        raise ValueError(f"calls={calls}: must be >= 1")
    history = synthetic_history(model.cfg, num_events, seed=num_events)
    candidates = np.arange(1, num_candidates + 1)
    model.rank_full(history, candidates)  # the bucket is warm, but the first call after others is not typical
    times = []
    for _ in range(calls):
        time.sleep(pause_s)
        t0 = time.perf_counter()
        model.rank_full(history, candidates)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"calls": calls, "median_ms": float(np.median(times)), "p90_ms": float(np.percentile(times, 90)),
            "max_ms": float(max(times))}


def best_by_slo(points: list[dict[str, Any]], axis: str, slos: list[float]) -> list[dict[str, Any]]:
    """For each budget, each mode's highest `axis` value (QPS or length) with P99 <= budget and no
    errors, from the same measured points, and the relay/baseline ratio."""
    rows = []
    for slo in slos:
        best = {m: max((p[axis] for p in points if p["mode"] == m and complies(p, slo)), default=0)
                for m in ("baseline", "relay")}
        rows.append({"slo_ms": slo, **best, "ratio": _ratio(best)})
    return rows


def _ratio(best: dict[str, float]) -> float:
    if best["baseline"]:
        return best["relay"] / best["baseline"]
    return float("inf") if best["relay"] else float("nan")


def _slo_grid(slo_ms: float) -> list[float]:
    return sorted({round(slo_ms * scale / 5.0) * 5.0 for scale in SLO_SCALES} - {0.0})


def prepare(config: RelayGRConfig, progress: Progress) -> tuple[Any, Any]:
    """One model, warmed up and calibrated, shared by every run (runs never overlap)."""
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.relay.calibrate import calibrate_latency
    from mindspore_relaygr.relay.engine import engine_chunk_bucket

    model = RelayGRModel(config)
    t0 = time.perf_counter()
    model.warmup(max_chunk=engine_chunk_bucket(model, config))
    latency = calibrate_latency(model, config.trigger.prefill_chunk_len)
    progress(f"warm-up + calibration: {time.perf_counter() - t0:.0f} s")
    return model, latency


def ablated(config: RelayGRConfig, variant: str) -> RelayGRConfig:
    """The relay config with one mechanism switched off."""
    if variant == "no_trigger":  # pre-infer everything the pool can hold, ignore risk and load
        trig = replace(config.trigger, risk_margin=1e-9, max_prefill_tokens_per_s=1e12, prefill_burst_tokens=10**9,
                       max_queued_prefills=10**6)
        return replace(config, trigger=trig)
    if variant == "no_expander":
        return replace(config, expander=replace(config.expander, enabled=False))
    return config


def _pair(config: RelayGRConfig, model: Any, latency: Any, workload: Workload, first_relay: bool,
          time_limit_s: float | None, relay_config: RelayGRConfig | None = None) -> dict[str, dict]:
    out = {}
    for relay in ((True, False) if first_relay else (False, True)):
        cfg = (relay_config or config) if relay else config
        engine = engine_for(cfg, model, latency, relay)
        try:
            out["relay" if relay else "baseline"] = run_one(engine, workload, relay, time_limit_s)
        finally:
            engine.close()
    return out


def complies(summary: dict[str, Any], slo_ms: float) -> bool:
    return summary["errors"] == 0 and summary["rejected_503"] == 0 and summary["p99_ms"] <= slo_ms


def slo_throughput(config: RelayGRConfig, model: Any, latency: Any, spec: WorkloadSpec, loads: list[float],
                   slo_ms: float, time_limit_s: float | None, progress: Progress) -> dict[str, Any]:
    base_cfg = replace(config, relay=replace(config.relay, max_online_len=spec.max_len))
    points = []
    for i, qps in enumerate(loads):
        pair = _pair(base_cfg, model, latency, Workload.generate(replace(spec, qps=qps)), i % 2 == 1, time_limit_s)
        for mode, s in pair.items():
            points.append({"mode": mode, "qps": qps, **s, "complies": complies(s, slo_ms)})
            progress(f"slo-throughput {qps:g} QPS {mode:>8}: p99 {s['p99_ms']:.0f} ms "
                     f"({'ok' if complies(s, slo_ms) else 'over'}), hit rate {s['hit_rate']:.2f}, "
                     f"longest device step {longest_step(s)}")
    best = {m: max((p["qps"] for p in points if p["mode"] == m and p["complies"]), default=0.0)
            for m in ("baseline", "relay")}
    return {"slo_ms": slo_ms, "points": points, "compliant_qps": best, "ratio": _ratio(best),
            "by_slo": best_by_slo(points, "qps", _slo_grid(slo_ms))}


def max_seq(config: RelayGRConfig, model: Any, latency: Any, spec: WorkloadSpec, lengths: list[int], qps: float,
            slo_ms: float, time_limit_s: float | None, progress: Progress) -> dict[str, Any]:
    points = []
    for i, length in enumerate(lengths):
        fixed = replace(spec, qps=qps, median_len=length, length_sigma=0.0, min_len=length, max_len=length,
                        growth_per_visit=0)
        base_cfg = replace(config, relay=replace(config.relay, max_online_len=length))
        pair = _pair(base_cfg, model, latency, Workload.generate(fixed), i % 2 == 1, time_limit_s)
        for mode, s in pair.items():
            points.append({"mode": mode, "length": length, **s, "complies": complies(s, slo_ms)})
            progress(f"max-seq {length} events {mode:>8}: p99 {s['p99_ms']:.0f} ms "
                     f"({'ok' if complies(s, slo_ms) else 'over'}), tiers {s['tiers']}, "
                     f"longest device step {longest_step(s)}")
    best = {m: max((p["length"] for p in points if p["mode"] == m and p["complies"]), default=0)
            for m in ("baseline", "relay")}
    return {"slo_ms": slo_ms, "qps": qps, "points": points, "max_len": best, "ratio": _ratio(best),
            "by_slo": best_by_slo(points, "length", _slo_grid(slo_ms))}


def ablation(config: RelayGRConfig, model: Any, latency: Any, spec: WorkloadSpec, slo_ms: float,
             time_limit_s: float | None, progress: Progress) -> list[dict[str, Any]]:
    rows = []
    workload = Workload.generate(spec)
    for variant in ABLATIONS:
        engine = engine_for(ablated(config, variant), model, latency, True)
        try:
            s = run_one(engine, workload, True, time_limit_s)
        finally:
            engine.close()
        rows.append({"variant": variant, **s, "complies": complies(s, slo_ms)})
        progress(f"ablation {variant:>12}: p99 {s['p99_ms']:.0f} ms, hit rate {s['hit_rate']:.2f}, "
                 f"tiers {s['tiers']}, wasted prefills {s['wasted_prefills']}")
    return rows


def format_report(report: dict[str, Any]) -> str:
    lines = []
    timing = report.get("cap_timing")
    if timing:
        runs = [(when, timing[when]) for when in ("before", "after") if when in timing]
        lines += [f"Unloaded full path at the {timing['cap_events']}-event cap, median of {runs[0][1]['calls']} calls: "
                  + ", ".join(f"{when} the sweep {t['median_ms']:.1f} ms" for when, t in runs), ""]
    if "slo_throughput" in report:
        r = report["slo_throughput"]
        lines += [f"SLO-compliant throughput (P99 <= {r['slo_ms']:g} ms, no errors)",
                  f"{'QPS':>6} | {'baseline p99':>12} {'ok':>3} | {'relay p99':>9} {'ok':>3} | relay hit rate"]
        by = {(p["mode"], p["qps"]): p for p in r["points"]}
        for qps in sorted({p["qps"] for p in r["points"]}):
            b, x = by[("baseline", qps)], by[("relay", qps)]
            lines.append(f"{qps:>6g} | {b['p99_ms']:>12.0f} {'y' if b['complies'] else 'n':>3} | "
                         f"{x['p99_ms']:>9.0f} {'y' if x['complies'] else 'n':>3} | {x['hit_rate']:.2f}")
        c = r["compliant_qps"]
        lines += [f"compliant QPS: baseline {c['baseline']:g}, relay {c['relay']:g} -> ratio {r['ratio']:.2f}x",
                  *_by_slo_lines(r, "QPS"), ""]
    if "max_seq" in report:
        r = report["max_seq"]
        lines += [f"Longest sequence at {r['qps']:g} QPS with P99 <= {r['slo_ms']:g} ms",
                  f"{'events':>7} | {'baseline p99':>12} {'ok':>3} | {'relay p99':>9} {'ok':>3}"]
        by = {(p["mode"], p["length"]): p for p in r["points"]}
        for length in sorted({p["length"] for p in r["points"]}):
            b, x = by[("baseline", length)], by[("relay", length)]
            lines.append(f"{length:>7} | {b['p99_ms']:>12.0f} {'y' if b['complies'] else 'n':>3} | "
                         f"{x['p99_ms']:>9.0f} {'y' if x['complies'] else 'n':>3}")
        m = r["max_len"]
        lines += [f"longest: baseline {m['baseline']}, relay {m['relay']} -> ratio {r['ratio']:.2f}x",
                  *_by_slo_lines(r, "events"), ""]
    if "ablation" in report:
        lines += ["Ablation (relay with one mechanism off)",
                  f"{'variant':>12} | {'p50':>5} {'p99':>6} | {'hit rate':>8} | {'wasted':>6} | tiers"]
        for row in report["ablation"]:
            lines.append(f"{row['variant']:>12} | {row['p50_ms']:>5.0f} {row['p99_ms']:>6.0f} | "
                         f"{row['hit_rate']:>8.2f} | {row['wasted_prefills']:>6} | {row['tiers']}")
    return "\n".join(lines)


def _by_slo_lines(result: dict[str, Any], unit: str) -> list[str]:
    rows = result.get("by_slo") or []
    if not rows:
        return []
    lines = [f"same points judged at other budgets (the trigger ran with {result['slo_ms']:g} ms):",
             f"{'SLO ms':>7} | {'baseline':>8} | {'relay':>8} | ratio ({unit})"]
    lines += [f"{r['slo_ms']:>7g} | {r['baseline']:>8g} | {r['relay']:>8g} | {r['ratio']:.2f}x" for r in rows]
    return lines
