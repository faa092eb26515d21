"""The paper's headline experiments, relay vs baseline side by side in one run (in-process engine).

* SLO-compliant throughput: sweep the offered QPS; a point complies if it has no errors and the
  upper end of its ranking P99's bootstrap interval is within the SLO (`tailstats`); a mode's
  SLO-compliant throughput is the highest load at and below which every tested load complies.
* Longest sequence: at a fixed load, sweep the history length; the same rule gives each mode's
  longest compliant length.
A mode stops once a point fails even the largest budget of the per-budget table (no later point
could count); each mode's load sweep goes on past its given loads, 1.5x at a time, until it has
failed (at most MAX_EXTRA_LOADS more). The baseline may have loads (lengths) of its own
(`--baseline-loads`, `--baseline-lengths`).
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

from mindspore_relaygr.bench import tailstats
from mindspore_relaygr.bench.engine_bench import engine_for, longest_step, run_one
from mindspore_relaygr.bench.tailstats import complies
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig

Progress = Callable[[str], None]
ABLATIONS = ("full", "no_trigger", "no_expander")
SLO_FACTOR = 2.0  # the budget leaves the full path at the production cap as much again for queueing
CAP_CALLS = 40  # unloaded full-path calls at the cap behind the derived budget
SLO_SCALES = (0.6, 0.8, 1.0, 1.25, 1.5, 2.0)  # budgets around the run's SLO in the sensitivity table
MODES = ("baseline", "relay")
MAX_EXTRA_LOADS = 4  # loads added past a mode's given loads while it still complies
LOAD_GROWTH = 1.5


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
    """For each budget, each mode's compliant `axis` value (QPS or length) from the same measured
    points, the first failing value above it, the relay/baseline ratio and the range of ratios the
    grid allows."""
    return [judge(points, axis, slo) for slo in slos]


def judge(points: list[dict[str, Any]], axis: str, slo_ms: float) -> dict[str, Any]:
    """One budget: {"slo_ms", "baseline", "relay", "first_failing": {mode: value | None}, "ratio",
    "ratio_range": [low, high]}."""
    brackets = {m: tailstats.bracket([p for p in points if p["mode"] == m], axis, slo_ms) for m in MODES}
    return {"slo_ms": slo_ms, **{m: brackets[m][0] for m in MODES},
            "first_failing": {m: brackets[m][1] for m in MODES},
            "ratio": tailstats.ratio(brackets["relay"][0], brackets["baseline"][0]),
            "ratio_range": list(tailstats.ratio_range(brackets["relay"], brackets["baseline"]))}


def _slo_grid(slo_ms: float) -> list[float]:
    return sorted({round(slo_ms * scale / 5.0) * 5.0 for scale in SLO_SCALES} - {0.0})


def prepare(config: RelayGRConfig, progress: Progress, checkpoint: str | None = None) -> tuple[Any, Any]:
    """One model (trained weights from `checkpoint` if given), warmed up and calibrated, shared by every
    run (runs never overlap)."""
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.relay.engine import calibrate_for_engine, warm_up_for_engine

    model = RelayGRModel(config)
    if checkpoint is not None:
        model.load_checkpoint(str(checkpoint))
    t0 = time.perf_counter()
    warm_up_for_engine(model, config, progress=progress)
    progress("calibrating the latency model")
    latency = calibrate_for_engine(model, config)
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
          time_limit_s: float | None, relay_config: RelayGRConfig | None = None,
          modes: tuple[str, ...] = MODES) -> dict[str, dict]:
    out = {}
    for relay in ((True, False) if first_relay else (False, True)):
        if ("relay" if relay else "baseline") not in modes:
            continue
        cfg = (relay_config or config) if relay else config
        engine = engine_for(cfg, model, latency, relay)
        try:
            out["relay" if relay else "baseline"] = run_one(engine, workload, relay, time_limit_s)
        finally:
            engine.close()
    return out


def _p99_text(s: dict[str, Any]) -> str:
    return f"p99 {s['p99_ms']:.0f} ms [{s['p99_low_ms']:.0f}, {s['p99_high_ms']:.0f}] of {s['samples']} ranks"


def _sweep(todo: dict[str, list[float]], slo_ms: float, run: Callable[[float, tuple[str, ...], int], dict[str, dict]],
           grow: Callable[[float], float] | None, axis: str, progress: Progress,
           label: Callable[[float], str], detail: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Run each mode's values in rising order, modes sharing a value back to back (`run(value, modes, i)`);
    a mode stops once a point fails the largest budget, and, when `grow` is given, goes on past its last
    value (at most MAX_EXTRA_LOADS more) while it still complies. Each point is reported as one progress
    line: `label(value)`, the mode, its P99 and `detail(stats)`."""
    top = max(_slo_grid(slo_ms))
    todo = {m: sorted(todo[m]) for m in MODES}
    points: list[dict[str, Any]] = []
    extra = dict.fromkeys(MODES, 0)
    failed: set[str] = set()  # failed the largest budget: no later point of the mode can count
    i = 0
    while active := [m for m in MODES if m not in failed and todo[m]]:
        value = min(todo[m][0] for m in active)
        modes = tuple(m for m in active if todo[m][0] == value)
        for m in modes:
            todo[m].pop(0)
        pair = run(value, modes, i)
        i += 1
        for mode, s in pair.items():
            points.append({"mode": mode, axis: value, **s, "complies": complies(s, slo_ms)})
            if not complies(s, top):
                failed.add(mode)
            elif grow is not None and not todo[mode] and extra[mode] < MAX_EXTRA_LOADS:
                todo[mode].append(grow(value))  # the mode still complies: go on until it fails
                extra[mode] += 1
            progress(f"{label(value)} {mode:>8}: {_p99_text(s)} ({'ok' if complies(s, slo_ms) else 'over'}), "
                     f"{detail(s)}, longest device step {longest_step(s)}")
    return points


def slo_throughput(config: RelayGRConfig, model: Any, latency: Any, spec: WorkloadSpec, loads: list[float],
                   slo_ms: float, time_limit_s: float | None, progress: Progress,
                   workload_at: Callable[[float], Any] | None = None,
                   baseline_loads: list[float] | None = None) -> dict[str, Any]:
    """Sweep the offered load on the synthetic workload of `spec`, or on `workload_at(qps)` when given
    (`spec.max_len` is still the baseline's cap). The baseline runs at `baseline_loads` when given (its
    capacity is far below the relay's, and a low load's point takes 1000 / QPS seconds), else at `loads`."""
    base_cfg = replace(config, relay=replace(config.relay, max_online_len=spec.max_len))

    def run(qps: float, modes: tuple[str, ...], i: int) -> dict[str, dict]:
        workload = workload_at(qps) if workload_at is not None else Workload.generate(replace(spec, qps=qps))
        return _pair(base_cfg, model, latency, workload, i % 2 == 1, time_limit_s, modes=modes)

    todo = {"baseline": list(baseline_loads or loads), "relay": list(loads)}
    points = _sweep(todo, slo_ms, run, lambda qps: round(qps * LOAD_GROWTH, 2), "qps", progress,
                    label=lambda qps: f"slo-throughput {qps:g} QPS", detail=lambda s: f"hit rate {s['hit_rate']:.2f}")
    at_slo = judge(points, "qps", slo_ms)
    return {"slo_ms": slo_ms, "points": points, "compliant_qps": {m: at_slo[m] for m in MODES},
            "first_failing_qps": at_slo["first_failing"], "ratio": at_slo["ratio"],
            "ratio_range": at_slo["ratio_range"], "by_slo": best_by_slo(points, "qps", _slo_grid(slo_ms))}


def max_seq(config: RelayGRConfig, model: Any, latency: Any, spec: WorkloadSpec | None, lengths: list[int], qps: float,
            slo_ms: float, time_limit_s: float | None, progress: Progress,
            workload_at: Callable[[int], Any] | None = None,
            baseline_lengths: list[int] | None = None) -> dict[str, Any]:
    """Sweep the history length at `qps`: by default every history has exactly that length (synthetic);
    `workload_at(length)` gives another workload per length instead (e.g. real timelines capped there).
    The baseline runs at `baseline_lengths` when given (its longest compliant history is far shorter than
    the relay's, and each point takes 1000 / QPS seconds), else at `lengths`. The sweep ends at the given
    lengths: a model has no bucket past its longest."""

    def run(length: float, modes: tuple[str, ...], i: int) -> dict[str, dict]:
        length = int(length)
        if workload_at is None:
            workload = Workload.generate(replace(spec, qps=qps, median_len=length, length_sigma=0.0, min_len=length,
                                                 max_len=length, growth_per_visit=0))
        else:
            workload = workload_at(length)
        base_cfg = replace(config, relay=replace(config.relay, max_online_len=length))
        return _pair(base_cfg, model, latency, workload, i % 2 == 1, time_limit_s, modes=modes)

    todo = {"baseline": list(baseline_lengths or lengths), "relay": list(lengths)}
    points = _sweep(todo, slo_ms, run, None, "length", progress,
                    label=lambda n: f"max-seq {int(n)} events", detail=lambda s: f"tiers {s['tiers']}")
    at_slo = judge(points, "length", slo_ms)
    return {"slo_ms": slo_ms, "qps": qps, "points": points, "max_len": {m: at_slo[m] for m in MODES},
            "first_failing_len": at_slo["first_failing"], "ratio": at_slo["ratio"],
            "ratio_range": at_slo["ratio_range"], "by_slo": best_by_slo(points, "length", _slo_grid(slo_ms))}


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
        lines += [f"SLO-compliant throughput (P99 interval's upper end <= {r['slo_ms']:g} ms, no errors)",
                  *_point_lines(r["points"], "qps", "QPS")]
        c = r["compliant_qps"]
        lines += [f"compliant QPS: baseline {c['baseline']:g}, relay {c['relay']:g} -> ratio {_ratio_text(r)}",
                  *_by_slo_lines(r, "QPS"), ""]
    if "max_seq" in report:
        r = report["max_seq"]
        lines += [f"Longest sequence at {r['qps']:g} QPS (P99 interval's upper end <= {r['slo_ms']:g} ms)",
                  *_point_lines(r["points"], "length", "events")]
        m = r["max_len"]
        lines += [f"longest: baseline {m['baseline']}, relay {m['relay']} -> ratio {_ratio_text(r)}",
                  *_by_slo_lines(r, "events"), ""]
    if "ablation" in report:
        lines += ["Ablation (relay with one mechanism off)",
                  f"{'variant':>12} | {'p50':>5} {'p99':>6} | {'hit rate':>8} | {'wasted':>6} | tiers"]
        for row in report["ablation"]:
            lines.append(f"{row['variant']:>12} | {row['p50_ms']:>5.0f} {row['p99_ms']:>6.0f} | "
                         f"{row['hit_rate']:>8.2f} | {row['wasted_prefills']:>6} | {row['tiers']}")
    return "\n".join(lines)


def _point_lines(points: list[dict[str, Any]], axis: str, unit: str) -> list[str]:
    """One row per tested value: each mode's P99 [interval] and ranks, and whether it complies (a mode is
    not run past a value where it failed the largest budget, nor off its own loads)."""
    by = {(p["mode"], p[axis]): p for p in points}

    def cell(p: dict[str, Any] | None) -> str:
        if p is None:
            return f"{'(not run)':>36}"
        return (f"{p['p99_ms']:>6.0f} [{p['p99_low_ms']:>5.0f}, {p['p99_high_ms']:>5.0f}] {p['samples']:>5} "
                f"{'y' if p['complies'] else 'n':>3}")

    head = f"{unit:>7} | {'baseline p99 [95% CI] ranks ok':>36} | {'relay p99 [95% CI] ranks ok':>36}"
    return [head] + [f"{v:>7g} | {cell(by.get(('baseline', v)))} | {cell(by.get(('relay', v)))}"
                     for v in sorted({p[axis] for p in points})]


def ratio_label(ratio: float, ratio_range: list[float]) -> str:
    """"4.00x", or ">= 3.00x" when the baseline complied at no tested value (the lower end is then relay's
    compliant value over the baseline's first failing one), or "n/a" when neither mode complied."""
    if math.isnan(ratio):
        return "n/a"
    if math.isinf(ratio):
        return f">= {ratio_range[0]:.2f}x" if not math.isnan(ratio_range[0]) else "unbounded"
    return f"{ratio:.2f}x"


def _ratio_text(r: dict[str, Any]) -> str:
    low, high = r["ratio_range"]
    return f"{ratio_label(r['ratio'], r['ratio_range'])} (the grid allows {low:.2f}-{high:.2f}x)"


def _by_slo_lines(result: dict[str, Any], unit: str) -> list[str]:
    rows = result.get("by_slo") or []
    if not rows:
        return []
    lines = [f"same points judged at other budgets (the trigger ran with {result['slo_ms']:g} ms):",
             f"{'SLO ms':>7} | {'baseline':>8} | {'relay':>8} | ratio ({unit}) | range the grid allows"]
    lines += [f"{r['slo_ms']:>7g} | {r['baseline']:>8g} | {r['relay']:>8g} | "
              f"{ratio_label(r['ratio'], r['ratio_range']):>12} | "
              f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}x" for r in rows]
    return lines
