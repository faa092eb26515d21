"""`relaygr bench quality-at-slo`: the ranking quality a P99 budget buys, baseline vs relay.

One trained model, one real-timeline workload (`bench.timeline`). For every history cap the workload
is replayed with each request cut to its `cap` most recent events, baseline (full inference on the
ranking path) and relay (pre-infer at retrieval, rank from the cache) back to back, as `bench
max-seq` does; a mode's longest compliant cap under a budget follows the same statistics
(`tailstats`). The test-split quality of the model at every cap (`train.cap_curve`, full ranking
over all items) then turns each mode's cap into NDCG@10 / HR@10: what a recommender team gets at
that budget. The same points are judged at budgets from 0.6x to 2x the run's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mindspore_relaygr.bench import headline
from mindspore_relaygr.bench.workload import WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.shipped_configs import config_arg, config_help

Progress = Callable[[str], None]


def quality_rows(by_slo: list[dict[str, Any]], quality_report: dict[str, Any]) -> list[dict[str, Any]]:
    """budget | baseline cap | baseline NDCG@10 / HR@10 | relay cap | relay NDCG@10 / HR@10 | cap ratio | gain.

    Quality is the cap curve's first filter (`quality_vs_cap`). A mode with no compliant cap gets cap 0 and
    no quality (NaN); the gain is relay minus baseline NDCG@10, with the paired standard error of that
    difference (the same test users at both caps; 0 when the caps are equal, NaN without a cap)."""
    from mindspore_relaygr.train.cap_curve import metrics_by_cap, paired_change

    quality = metrics_by_cap(quality_report)
    rows = []
    for judged in by_slo:
        row: dict[str, Any] = {"slo_ms": judged["slo_ms"]}
        for mode in headline.MODES:
            cap = judged[mode] or 0
            q = quality.get(cap, {})
            row[mode] = {"cap": cap, "ndcg@10": q.get("ndcg@10", math.nan), "hr@10": q.get("hr@10", math.nan)}
        row["cap_ratio"] = judged["ratio"]
        row["ndcg_gain"] = row["relay"]["ndcg@10"] - row["baseline"]["ndcg@10"]
        low, high = row["baseline"]["cap"], row["relay"]["cap"]
        row["ndcg_gain_se"] = math.nan
        if low in quality and high in quality:
            change = paired_change(quality_report, low, high)
            row["ndcg_gain_se"] = 0.0 if change is None else change["se"]
        rows.append(row)
    return rows


def truncation_cost(model: Any, config: RelayGRConfig, timeline: Any, points: list[dict[str, Any]]) -> dict[str, Any]:
    """For every point's truncated ranks (miss_policy truncate): NDCG@10 / HR@10 of the visit's first
    item among all items, ranked on the events the rank used and on the whole history at that cap
    (each history's items filtered), through the batched forward. Keyed "<mode>@<cap>"."""
    from mindspore_relaygr.bench.timeline import TimelineRequest
    from mindspore_relaygr.train.full_ranking import BatchedScorer, RankingCase, metrics_of

    scorer = None
    out: dict[str, Any] = {}
    for point in points:
        rows = point.get("truncated_requests") or []
        if not rows:
            continue
        scorer = scorer or BatchedScorer(model.net, config.model, timeline.num_items)
        capped = timeline.with_spec(max_len=point["length"])
        cut, whole = [], []
        for row in rows:
            req = TimelineRequest(**row["request"])
            hist = capped.history(req)
            items = timeline.sequences[req.user].item_ids
            target, earlier = int(items[req.end]), items[:req.end]
            whole.append(RankingCase(req.user, hist, target, earlier))
            cut.append(RankingCase(req.user, hist.slice(len(hist) - row["ranked_events"]), target, earlier))
        m_cut, m_whole = metrics_of(scorer.ranks(cut)), metrics_of(scorer.ranks(whole))
        out[f"{point['mode']}@{point['length']}"] = {
            "ranks": len(rows), "ranked_events_mean": sum(r["ranked_events"] for r in rows) / len(rows),
            "ndcg@10_truncated": m_cut["ndcg@10"], "ndcg@10_whole": m_whole["ndcg@10"],
            "hr@10_truncated": m_cut["hr@10"], "hr@10_whole": m_whole["hr@10"]}
    return out


def run_quality_at_slo(config: RelayGRConfig, checkpoint: str, timeline: Any, caps: list[int], qps: float,
                       loads: list[float], slo_ms: float | str, cap_events: int, time_limit_s: float | None,
                       progress: Progress) -> dict[str, Any]:
    """Quality at each cap, the latency sweep over caps at `qps` on the timeline, then (if `loads`) the
    SLO-compliant throughput on the timeline with histories at the largest cap; returns the report."""
    from mindspore_relaygr.train.cap_curve import quality_vs_cap

    caps = sorted(set(caps))
    quality_report = quality_vs_cap(config, checkpoint, caps, "test", progress=progress)
    quality_filter = next(iter(quality_report["filters"]))  # the reference filter: fixed, whatever the cap
    model, latency = headline.prepare(config, progress, checkpoint)
    at_cap = headline.time_full_path(model, cap_events, timeline.spec.num_candidates)
    rule: dict[str, Any] = {"rule": "fixed (--slo-ms)"}
    if slo_ms == "auto":
        slo_ms = headline.derive_slo_ms(at_cap["median_ms"])
        rule = {"rule": f"{headline.SLO_FACTOR:g} x the median unloaded full path at the cap, rounded up to 5 ms",
                "cap_events": cap_events, "full_ms_at_cap": at_cap["median_ms"]}
    progress(f"budget {slo_ms:g} ms (full path at {cap_events} events: median {at_cap['median_ms']:.1f} ms)")
    config = replace(config, trigger=replace(config.trigger, slo_ms=float(slo_ms)))
    sweep = headline.max_seq(config, model, latency, None, caps, qps, float(slo_ms), time_limit_s, progress,
                             workload_at=lambda cap: timeline.with_spec(max_len=cap, qps=qps))
    truncations = truncation_cost(model, config, timeline, sweep["points"])
    for key, cost in truncations.items():
        progress(f"truncated ranks {key}: {cost['ranks']} on {cost['ranked_events_mean']:.0f} events on average, "
                 f"NDCG@10 {cost['ndcg@10_truncated']:.4f} against {cost['ndcg@10_whole']:.4f} untruncated")
    throughput = None
    if loads:
        top_cap = max(caps)
        # spec.max_len is the baseline's cap; the requests come from the timeline.
        spec = WorkloadSpec(max_len=top_cap, qps=loads[0], num_candidates=timeline.spec.num_candidates)
        throughput = headline.slo_throughput(config, model, latency, spec, loads, float(slo_ms), time_limit_s, progress,
                                             workload_at=lambda q: timeline.with_spec(max_len=top_cap, qps=q))
    return {"slo_ms": slo_ms, "slo_rule": rule, "slo_throughput": throughput, "truncations": truncations,
            "miss_policy": config.relay.miss_policy, "qps": qps, "caps": caps,
            "checkpoint": str(checkpoint),
            "timeline": {**timeline.spec.__dict__, **timeline.describe()}, "quality": quality_report,
            "quality_filter": quality_filter, "latency": sweep, "table": quality_rows(sweep["by_slo"], quality_report)}


def format_report(report: dict[str, Any]) -> str:
    lines = [f"Quality at a P99 budget: real timelines at {report['qps']:g} QPS, caps {report['caps']}; "
             f"run budget {report['slo_ms']:g} ms",
             f"{'SLO ms':>7} | {'base cap':>8} {'NDCG@10':>8} | {'relay cap':>9} {'NDCG@10':>8} | "
             f"{'cap ratio':>9} | {'NDCG gain +- se':>17}"]
    for r in report["table"]:
        b, rl = r["baseline"], r["relay"]
        lines.append(f"{r['slo_ms']:>7g} | {b['cap']:>8} {b['ndcg@10']:>8.4f} | {rl['cap']:>9} {rl['ndcg@10']:>8.4f} | "
                     f"{headline.ratio_label(r['cap_ratio'], [math.nan, math.nan]):>9} | "
                     f"{r['ndcg_gain']:>+8.4f} +- {r['ndcg_gain_se']:.4f}")
    for key, cost in (report.get("truncations") or {}).items():
        lines.append(f"truncated ranks {key}: {cost['ranks']}, NDCG@10 {cost['ndcg@10_truncated']:.4f} on the events "
                     f"used vs {cost['ndcg@10_whole']:.4f} on the whole history (HR@10 {cost['hr@10_truncated']:.4f} "
                     f"vs {cost['hr@10_whole']:.4f})")
    tp = report.get("slo_throughput")
    if tp:
        c = tp["compliant_qps"]
        lines.append(f"SLO-compliant throughput on the timelines (histories up to {max(report['caps'])} events): "
                     f"baseline {c['baseline']:g} QPS, relay {c['relay']:g} QPS -> "
                     f"{headline.ratio_label(tp['ratio'], tp['ratio_range'])}")
    return "\n".join(lines)


def plot_quality_at_slo(report: dict[str, Any], path: Any) -> None:
    """NDCG@10 each mode reaches vs the budget, and the model's NDCG@10 vs cap."""
    from mindspore_relaygr.bench.plots import pyplot, save_figure

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    table = report["table"]
    for mode, style in (("baseline", "o-"), ("relay", "s-")):
        ax.plot([r["slo_ms"] for r in table], [r[mode]["ndcg@10"] for r in table], style, label=mode)
    ax.axvline(report["slo_ms"], color="grey", linestyle=":", label=f"run budget {report['slo_ms']:g} ms")
    ax.set(xlabel="P99 budget (ms)", ylabel="test NDCG@10 at the longest compliant cap",
           title="what the budget buys")
    ax.legend(fontsize=8)
    from mindspore_relaygr.train.cap_curve import metrics_by_cap

    by_cap = metrics_by_cap(report["quality"])
    caps = sorted(by_cap)
    bx.errorbar(caps, [by_cap[c]["ndcg@10"] for c in caps], yerr=[2 * by_cap[c]["se"]["ndcg@10"] for c in caps],
                fmt="o-", capsize=3)
    bx.set(xscale="log", xlabel="history cap (events)", ylabel=f"test NDCG@10 (filter {report['quality_filter']})",
           title="the model vs its cap (+- 2 SE)")
    bx.minorticks_off()
    bx.set_xticks(caps, [str(c) for c in caps])
    save_figure(fig, path)
    plt.close(fig)


def cmd_quality_at_slo(args: Any) -> int:
    from pathlib import Path

    from mindspore_relaygr.bench.model_bench import write_report
    from mindspore_relaygr.bench.timeline import TimelineSpec, TimelineWorkload, format_description
    from mindspore_relaygr.config import load_config, save_config

    policy = [f"relay.miss_policy={args.miss_policy}"] if args.miss_policy else []
    cfg = load_config(args.config or Path(args.checkpoint).parent / "config.yaml", [*args.override, *policy])
    say = lambda msg: print(f"[bench] {msg}", flush=True)  # noqa: E731
    if args.workload:
        timeline = TimelineWorkload.load(args.workload)
    else:
        timeline = TimelineWorkload.generate(TimelineSpec(data_path=cfg.data.path, num_requests=args.requests,
                                                          gap_ms=args.gap_ms, min_gap_ms=args.min_gap_ms,
                                                          seed=args.seed))
    timeline.check_model(cfg.model.num_items, cfg.model.num_actions)
    timeline = timeline.with_spec(num_candidates=args.candidates, user_features=bool(cfg.model.user_feature_sizes))
    say(f"timeline: {format_description(timeline.describe())}")
    report = run_quality_at_slo(cfg, args.checkpoint, timeline, args.caps, args.qps, args.loads, args.slo_ms,
                                args.cap_events, args.time_limit, say)
    print(format_report(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    timeline.save(out.with_suffix(".workload.json"))
    write_report(report, out)
    save_config(cfg, out.with_suffix(".config.yaml"))
    plot_quality_at_slo(report, out.with_suffix(".png"))
    print(f"[bench] wrote {out}, its plot, config and workload next to it")
    return 0


def register(bench_subparsers: Any, positive_int: Callable[[str], int], slo_arg: Callable[[str], Any]) -> None:
    """Add `relaygr bench quality-at-slo`."""
    from mindspore_relaygr.bench.tailstats import MIN_RANKS

    p = bench_subparsers.add_parser("quality-at-slo", help="test NDCG@10 each mode reaches under a P99 budget "
                                                           "(real ML-1M timelines, a trained model)")
    p.add_argument("--checkpoint", required=True, help="checkpoint written by `relaygr train`")
    p.add_argument("--config", type=config_arg, default=None,
                   help=config_help().replace("%(default)s", "config.yaml next to --checkpoint"))
    p.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--caps", type=positive_int, nargs="+", required=True,
                   help="history caps to sweep (events), each at most the model's history length")
    p.add_argument("--qps", type=float, default=5.0, help="offered load of the cap sweep")
    p.add_argument("--loads", type=float, nargs="*", default=[5.0, 10.0, 20.0, 40.0],
                   help="loads of the throughput sweep at the largest cap (none: skip it)")
    p.add_argument("--slo-ms", type=slo_arg, default="auto",
                   help="P99 budget in ms, or 'auto': twice the unloaded full path at --cap-events")
    p.add_argument("--cap-events", type=positive_int, default=200,
                   help="production cap of full inference behind --slo-ms auto (the reference's 200 events)")
    p.add_argument("--miss-policy", choices=("full", "truncate"), default=None,
                   help="relay.miss_policy of the relay runs (truncate: a miss that would blow the budget ranks "
                        "fewer events; the report gives the NDCG@10 of exactly those ranks); default: the config's")
    p.add_argument("--workload", default=None, metavar="FILE", help="saved timeline (relaygr workload timeline)")
    p.add_argument("--requests", type=positive_int, default=MIN_RANKS, help="ranks per point (generated timeline)")
    p.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap")
    p.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap")
    p.add_argument("--candidates", type=positive_int, default=128)
    p.add_argument("--time-limit", type=float, default=None, help="stop each run after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="outputs/quality_at_slo.json")
    p.set_defaults(func=cmd_quality_at_slo)
