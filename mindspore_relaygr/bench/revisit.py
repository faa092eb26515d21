"""`relaygr bench revisit`: which cache tier serves the ranks as users revisit more often.

Revisit rate = the fraction of a workload's requests whose user made an earlier request of the
same workload (`Workload.revisit_fraction`, i.e. 1 - distinct users / requests). Each point is
one Zipf exponent of user popularity (`--zipf`) at a fixed user count, request count, seed and
load: a larger exponent concentrates the requests on fewer users, so more of them are revisits.
The x axis is the revisit fraction *measured* on the requests actually replayed, never the knob.

Each point replays the seeded cascade workload open-loop against the in-process relay engine with
the DRAM expander on and reports the share of ranks served per tier (device, dram, partial,
inflight, miss) with P50/P99; `--no-expander-too` replays the same workload with the expander off
as well (back to back, alternating which goes first) to show what the DRAM tier adds. One warmed,
calibrated model serves every run, and runs never overlap.

Defaults (with configs/bench_long.yaml) and why:
* 1000 users, 100 requests per point: from 94 distinct users (zipf 0, revisit rate 0.06) down
  to 8 (zipf 2, revisit rate 0.92), so the working set crosses the device pool's size mid-sweep.
* `cache.num_slots` 8 (the config's, 34 MB per 4096-token slot): far fewer slots than users, so
  at low and middle revisit rates a user's prefix has left the device before they come back and
  the revisit finds it in DRAM, has it re-prefilled, or misses; at the top few users fit the pool.
  Raise it with `-o cache.num_slots=N` to watch the device share grow.
* `expander.dram_bytes` 2e9 (the default): ~110 prefixes of the mean history (~2200 events at
  8.2 KB per cached event), every relayed user of a point, so DRAM never runs out of room.
  Shrink it (`-o expander.dram_bytes=2e8`, ~11 prefixes) to see DRAM capacity misses.
* median history 2048 events: full inference of most users exceeds the 150 ms SLO, so most users
  are at risk and get relayed (short histories are never relayed: their ranks are "miss").
* `--growth 0`: a user comes back with the same history, so their cached prefix is still exact.
  With growth > 0 the cached prefix (device or DRAM) still serves the grown history while the
  new events fit the rank's suffix (the pre-infer answers `already_cached` and prefetches a DRAM
  copy back to the device); beyond that the pre-infer extends the cached prefix by only the new
  events (`cache.enable_extension`), unless the latency model says a fresh prefill is cheaper.
  `--no-extension-too` replays every point with the extension off as well, and the
  `pf ev/req` column (prefix events computed per request) shows the work it saves.
* 1 QPS: a ~2200-event prefill costs ~200 ms on this CPU, so the one device thread stays well
  below saturation and the shares show where prefixes are rather than queueing (the `load` and
  `footprint` refusals in each row's `trigger` counts say when that stops being true).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.shipped_configs import config_arg, config_help

Progress = Callable[[str], None]
TIER_ORDER = ("device", "dram", "partial", "inflight", "miss")  # the tiers a relayed rank can land in
TIER_COLORS = {
    "device": "tab:blue",
    "dram": "tab:orange",
    "partial": "tab:purple",
    "inflight": "tab:green",
    "miss": "tab:red",
}
DEFAULT_ZIPF = [0.0, 0.6, 1.0, 1.3, 1.6, 2.0]


def trim(workload: Workload, duration_s: float | None) -> Workload:
    """The requests that arrive within `duration_s` (all of them for None); histories are unchanged."""
    if duration_s is None:
        return workload
    return replace(workload, requests=[r for r in workload.requests if r.at_s <= duration_s])


def tier_shares(tiers: dict[str, int]) -> dict[str, float]:
    """Share of the served ranks per tier: every tier of TIER_ORDER, then any other tier seen."""
    total = sum(tiers.values())
    names = [*TIER_ORDER, *sorted(set(tiers) - set(TIER_ORDER))]
    return {name: (tiers.get(name, 0) / total if total else 0.0) for name in names}


def _run(config: RelayGRConfig, model: Any, latency: Any, workload: Workload) -> dict[str, Any]:
    from mindspore_relaygr.bench.engine_bench import engine_for, run_one

    engine = engine_for(config, model, latency, relay=True)
    try:
        summary = run_one(engine, workload, relay=True, time_limit_s=None)
        summary["cache"] = engine.stats().to_dict()["cache"]  # the engine is idle: run_one waited for its prefills
    finally:
        engine.close()
    summary["shares"] = tier_shares(summary["tiers"])
    computed = summary["engine"]["prefill_events"] + summary["engine"]["extended_events"]
    summary["prefill_events_per_request"] = computed / max(1, summary["ranks"])
    return summary


def run_revisit(
    config: RelayGRConfig,
    model: Any,
    latency: Any,
    spec: WorkloadSpec,
    zipfs: list[float],
    time_limit_s: float | None,
    expander_too: bool,
    progress: Progress,
    extension_too: bool = False,
) -> dict[str, Any]:
    """One row per (zipf point, mode): measured revisit fraction, tier shares, prefill events computed
    per request, latency. Modes: expander and extension on; with `expander_too` also the expander
    off; with `extension_too` also the extension across requests off (`cache.enable_extension`)."""
    modes = [(True, True)] + ([(False, True)] if expander_too else []) + ([(True, False)] if extension_too else [])
    rows = []
    for i, zipf_a in enumerate(zipfs):
        workload = trim(Workload.generate(replace(spec, zipf_a=zipf_a)), time_limit_s)
        revisit = workload.revisit_fraction()
        for expander, extension in modes if i % 2 == 0 else modes[::-1]:
            cfg = replace(config, expander=replace(config.expander, enabled=expander),
                          cache=replace(config.cache, enable_extension=extension))
            s = _run(cfg, model, latency, workload)
            rows.append(
                {
                    "zipf_a": zipf_a,
                    "revisit_fraction": revisit,
                    "requests": len(workload.requests),
                    "distinct_users": len({r.user for r in workload.requests}),
                    "expander": expander,
                    "extension": extension,
                    **s,
                }
            )
            progress(
                f"zipf {zipf_a:g} (revisits {revisit:.2f}) expander {'on ' if expander else 'off'} extension "
                f"{'on ' if extension else 'off'}: p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms, "
                + ", ".join(f"{k} {v:.2f}" for k, v in s["shares"].items() if v)
                + f", prefill events/request {s['prefill_events_per_request']:.0f}, errors {s['errors']}"
            )
    return {
        "spec": {**asdict(spec), "zipf_a": zipfs},
        "time_limit_s": time_limit_s,
        "zipf_a": zipfs,
        "qps": spec.qps,
        "slo_ms": config.trigger.slo_ms,
        "num_slots": model.num_slots,
        "slot_bytes": model.layout.slot_bytes,
        "dram_bytes": config.expander.dram_bytes,
        "growth_per_visit": spec.growth_per_visit,
        "results": rows,
    }


def format_table(report: dict[str, Any]) -> str:
    tiers = [*TIER_ORDER, *sorted({t for r in report["results"] for t in r["shares"]} - set(TIER_ORDER))]
    head = (
        f"{'zipf':>5} {'revisit':>7} {'DRAM':>4} {'ext':>3} | "
        + " ".join(f"{t:>8}" for t in tiers)
        + f" | {'hit rate':>8} | {'pf ev/req':>9} | {'p50 ms':>7} {'p99 ms':>7} | {'trunc':>5} {'errors':>6} "
        f"{'wasted':>6}"
    )
    lines = [
        f"{report['qps']:g} QPS, {report['num_slots']} device slots, DRAM {report['dram_bytes'] / 1e9:g} GB, "
        f"SLO {report['slo_ms']:g} ms, growth {report.get('growth_per_visit', 0)} events per visit; tier columns "
        "are shares of the served ranks; pf ev/req: prefix events computed (prefills + extensions) per request",
        head,
        "-" * len(head),
    ]
    for r in sorted(report["results"], key=lambda r: (r["revisit_fraction"], not r["expander"],
                                                      not r.get("extension", True))):
        lines.append(
            f"{r['zipf_a']:>5g} {r['revisit_fraction']:>7.3f} {'on' if r['expander'] else 'off':>4} "
            f"{'on' if r.get('extension', True) else 'off':>3} | "
            + " ".join(f"{r['shares'].get(t, 0.0):>8.3f}" for t in tiers)
            + f" | {r['hit_rate']:>8.3f} | {r.get('prefill_events_per_request', float('nan')):>9.0f} | "
            f"{r['p50_ms']:>7.0f} {r['p99_ms']:>7.0f} | {r['truncations']:>5} {r['errors']:>6} "
            f"{r['wasted_prefills']:>6}"
        )
    return "\n".join(lines)


def plot_revisit(report: dict[str, Any], path: Path) -> None:
    """Left: tier shares (stacked) vs measured revisit rate, expander on (and the hit rate with it off).
    Right: rank P99 (and P50) vs revisit rate, with the SLO."""
    from mindspore_relaygr.bench.plots import pyplot, save_figure

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.5))
    by_mode = {
        m: sorted((r for r in report["results"] if r["expander"] is m and r.get("extension", True)),
                  key=lambda r: r["revisit_fraction"])
        for m in (True, False)
    }
    on = by_mode[True]
    xs = [r["revisit_fraction"] for r in on]
    tiers = [t for t in TIER_ORDER if any(r["shares"].get(t, 0.0) for r in on)]
    ax.stackplot(
        xs,
        [[r["shares"].get(t, 0.0) for r in on] for t in tiers],
        labels=tiers,
        colors=[TIER_COLORS[t] for t in tiers],
        alpha=0.85,
    )
    if by_mode[False]:
        ax.plot(
            [r["revisit_fraction"] for r in by_mode[False]],
            [r["hit_rate"] for r in by_mode[False]],
            "k--o",
            label="hit rate, expander off",
        )
    ax.set(
        xlabel="measured revisit rate (share of requests from a returning user)",
        ylabel="share of ranks",
        ylim=(0, 1),
        title=f"where ranks are served from (expander on, {report['qps']:g} QPS)",
    )
    ax.legend(fontsize=8, loc="lower left", framealpha=0.9)
    for mode, color in ((True, "tab:orange"), (False, "tab:blue")):
        rows = by_mode[mode]
        if rows:
            label = "expander on" if mode else "expander off"
            rx = [r["revisit_fraction"] for r in rows]
            bx.plot(rx, [r["p99_ms"] for r in rows], "o-", color=color, label=f"P99, {label}")
            bx.plot(rx, [r["p50_ms"] for r in rows], "s:", color=color, label=f"P50, {label}")
    bx.axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    bx.set(xlabel="measured revisit rate", ylabel="rank latency (ms)", title="ranking latency")
    bx.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def _spec(args: argparse.Namespace, cfg: RelayGRConfig) -> WorkloadSpec:
    capacity = min(cfg.model.max_seq_len - (1 if cfg.model.user_feature_sizes else 0), cfg.cache.max_prefix_len)
    max_len = min(args.max_len, capacity)
    return WorkloadSpec(
        num_users=args.users,
        num_requests=args.num_requests,
        qps=args.qps,
        median_len=min(args.median_len, max_len),
        min_len=min(64, max_len),
        max_len=max_len,
        gap_ms=args.gap_ms,
        min_gap_ms=args.min_gap_ms,
        num_candidates=args.candidates,
        growth_per_visit=args.growth,
        num_items=cfg.model.num_items,
        num_actions=cfg.model.num_actions,
        seed=args.seed,
    )


def cmd_bench_revisit(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import headline
    from mindspore_relaygr.bench.model_bench import write_report
    from mindspore_relaygr.config import load_config, save_config

    def say(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    cfg = load_config(args.config, args.override)
    spec = _spec(args, cfg)
    t0 = time.perf_counter()
    model, latency = headline.prepare(cfg, say)
    report = run_revisit(cfg, model, latency, spec, args.zipf, args.time_limit, args.no_expander_too, say,
                         extension_too=args.no_extension_too)
    report["config"] = str(args.config)
    report["wall_s"] = time.perf_counter() - t0
    out = Path(args.out)
    print(format_table(report))
    write_report(report, out)
    save_config(cfg, out.with_suffix(".config.yaml"))
    plot_revisit(report, out.with_suffix(".png"))
    print(f"[bench] wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.config.yaml')}")
    return 0


def register(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `revisit` to the `relaygr bench` sub-commands."""
    p = bench_subparsers.add_parser("revisit", help="share of ranks per cache tier vs the measured revisit rate")
    p.add_argument("--config", type=config_arg, default="bench_long", help=config_help())
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config value (repeatable), e.g. -o cache.num_slots=16 -o expander.dram_bytes=5e8",
    )
    p.add_argument("--qps", type=float, default=1.0, help="offered load of every point")
    p.add_argument(
        "--zipf",
        "--points",
        type=float,
        nargs="+",
        default=DEFAULT_ZIPF,
        help="Zipf exponents of user popularity, one point each (larger: more revisits)",
    )
    p.add_argument("--users", type=int, default=1000, help="user population (more users: fewer revisits)")
    p.add_argument("--num-requests", type=int, default=100, help="requests per point and mode")
    p.add_argument("--median-len", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--candidates", type=int, default=128)
    p.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap (as the headline)")
    p.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap (retrieval + pre-ranking)")
    p.add_argument(
        "--growth", type=int, default=0, help="events a user's history grows by between two visits (see the module doc)"
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=150.0,
        help="replay only the requests arriving in the first this many seconds of each point",
    )
    p.add_argument(
        "--no-expander-too", action="store_true", help="also run every point with the DRAM expander off (same workload)"
    )
    p.add_argument(
        "--no-extension-too", action="store_true",
        help="also run every point with the extension across requests off (cache.enable_extension=false)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="outputs/bench_revisit.json")
    p.set_defaults(func=cmd_bench_revisit)
