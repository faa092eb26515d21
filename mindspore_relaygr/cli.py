"""The `relaygr` command: `relaygr demo`, `relaygr bench model`, ..."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mindspore_relaygr.bench.tailstats import MIN_RANKS
from mindspore_relaygr.config import load_config, save_config
from mindspore_relaygr.errors import RelayGRError
from mindspore_relaygr.shipped_configs import config_arg, config_help


def _add_config_args(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--config", type=config_arg, default=default.removesuffix(".yaml"), help=config_help())
    parser.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. -o cache.num_slots=8")


def cmd_demo(args: argparse.Namespace) -> int:
    """Build a model, prefill one user's prefix, rank candidates both ways and compare."""
    import numpy as np

    from mindspore_relaygr.model import RelayGRModel

    cfg = load_config(args.config, args.override)
    t0 = time.perf_counter()
    model = RelayGRModel(cfg)
    print(f"[demo] model built ({cfg.model.num_layers} layers, d={cfg.model.d_model}, backend: "
          f"{model.backend.name}) in {time.perf_counter() - t0:.1f} s")
    rng = np.random.default_rng(args.seed)
    n = min(args.events, cfg.cache.max_prefix_len - 1 + cfg.model.max_suffix_len, cfg.model.max_seq_len - 1)
    suffix = min(args.suffix, n - 1, cfg.model.max_suffix_len)
    hist = {"item_ids": rng.integers(1, cfg.model.num_items + 1, n),
            "action_ids": rng.integers(0, cfg.model.num_actions, n),
            "timestamps": 1_700_000_000 + np.cumsum(rng.integers(0, 86400, n))}
    if cfg.model.user_feature_sizes:
        hist["user_features"] = [1] * len(cfg.model.user_feature_sizes)
    cands = rng.choice(np.arange(1, cfg.model.num_items + 1), size=min(args.candidates, cfg.model.max_candidates),
                       replace=False)
    pre = {k: (v if k == "user_features" else v[: n - suffix]) for k, v in hist.items()}
    suf = {k: v[n - suffix:] for k, v in hist.items() if k != "user_features"}
    print(f"[demo] user with {n} events: prefix {n - suffix}, suffix {suffix}, {len(cands)} candidates")
    for label, fn in (("compile full", lambda: model.rank_full(hist, cands)),
                      ("compile prefill", lambda: model.prefill(0, pre)),
                      ("compile cached", lambda: model.rank_cached(0, n - suffix, suf, cands))):
        t0 = time.perf_counter()
        fn()
        print(f"[demo] {label}: {time.perf_counter() - t0:.1f} s")
    timings = {}
    for label, fn in (("rank_full", lambda: model.rank_full(hist, cands)),
                      ("prefill", lambda: model.prefill(0, pre)),
                      ("rank_cached", lambda: model.rank_cached(0, n - suffix, suf, cands))):
        t0 = time.perf_counter()
        out = fn()
        timings[label] = (time.perf_counter() - t0) * 1e3
        if label == "rank_full":
            full = out
        if label == "rank_cached":
            cached = out
    order = np.argsort(-full[:, 0])[:5]
    print("[demo] top-5 candidates by p(engage):   item   full[engage, high_rating]   cached[...]")
    for i in order:
        print(f"         {cands[i]:>6}   {full[i, 0]:.6f} {full[i, 1]:.6f}   {cached[i, 0]:.6f} {cached[i, 1]:.6f}")
    print(f"[demo] max |full - cached| = {np.abs(full - cached).max():.2e} (R1 requires <= 1e-5)")
    print("[demo] timings: " + ", ".join(f"{k} {v:.1f} ms" for k, v in timings.items()))
    return 0 if np.abs(full - cached).max() <= 1e-5 else 1


def cmd_bench_model(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.model_bench import format_table, run_model_bench, write_report

    batches = sorted(set(args.batch))
    cfg = load_config(args.config, [f"cache.num_slots={max([1, *batches])}",
                                    f"model.batch_buckets={sorted({1, *batches})}", *args.override])
    report = run_model_bench(cfg, args.prefix_lens, args.candidates, args.suffix, args.repeats,
                             progress=lambda msg: print(f"[bench] {msg}", flush=True), batches=batches)
    report["config"] = str(args.config)
    print(format_table(report))
    out = Path(args.out)
    write_report(report, out)
    save_config(cfg, out.with_suffix(".config.yaml"))
    plots.plot_model_bench(report, out.with_suffix(".png"))
    print(f"[bench] wrote {out} and {out.with_suffix('.png').name}")
    return 0


def cmd_bench_batching(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.batch_bench import format_table, run_batch_bench
    from mindspore_relaygr.bench.model_bench import write_report

    cfg = load_config(args.config, [f"cache.num_slots={args.users}", *args.override])
    report = run_batch_bench(cfg, args.users, args.clients, args.events, args.suffix, args.candidates, args.batch,
                             args.seconds, args.rounds, progress=lambda msg: print(f"[bench] {msg}", flush=True),
                             low_qps=args.low_qps, low_requests=args.low_requests)
    report["config"] = str(args.config)
    print(format_table(report))
    out = Path(args.out)
    write_report(report, out)
    save_config(cfg, out.with_suffix(".config.yaml"))
    plots.plot_batch_bench(report, out.with_suffix(".png"))
    print(f"[bench] wrote {out} and {out.with_suffix('.png').name}")
    return 0


def cmd_bench_cache(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench.cache_bench import copy_vs_recompute, format_tables, pool_cost_vs_slots
    from mindspore_relaygr.bench.model_bench import write_report

    cfg = load_config(args.config, args.override)
    say = lambda msg: print(f"[bench] {msg}", flush=True)  # noqa: E731
    report = {"config": str(args.config), "copy": copy_vs_recompute(cfg, args.prefix_lens, args.repeats, say)}
    pool_cfg = load_config(args.config, [f"cache.max_prefix_len={args.pool_prefix_len}", *args.override])
    report["pool_prefix_len"] = args.pool_prefix_len
    report["pool"] = pool_cost_vs_slots(pool_cfg, args.slots, args.pool_prefix_len - args.suffix, args.suffix,
                                        args.repeats, say)
    print(format_tables(report))
    write_report(report, Path(args.out))
    print(f"[bench] wrote {args.out}")
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench.engine_bench import format_table, run_engine_bench
    from mindspore_relaygr.bench.model_bench import write_report
    from mindspore_relaygr.bench.workload import WorkloadSpec

    cfg = load_config(args.config, args.override)
    model_max = cfg.model.max_seq_len - (1 if cfg.model.user_feature_sizes else 0)
    timeline = None
    if args.workload:
        from mindspore_relaygr.bench.timeline import TimelineWorkload, format_description

        timeline = TimelineWorkload.load(args.workload)
        timeline.check_model(cfg.model.num_items, cfg.model.num_actions)
        timeline = timeline.with_spec(max_len=min(args.max_len, timeline.spec.max_len, model_max),
                                      num_candidates=args.candidates,
                                      user_features=bool(cfg.model.user_feature_sizes))
        print(f"[bench] timeline {args.workload}: {format_description(timeline.describe())}")
    spec = WorkloadSpec(num_users=args.users, num_requests=args.requests, median_len=args.median_len,
                        max_len=min(args.max_len, model_max),
                        gap_ms=args.gap_ms, min_gap_ms=args.min_gap_ms, num_candidates=args.candidates,
                        num_items=cfg.model.num_items, num_actions=cfg.model.num_actions, seed=args.seed)
    report = run_engine_bench(cfg, spec, args.loads, args.time_limit,
                              progress=lambda msg: print(f"[bench] {msg}", flush=True), timeline=timeline)
    print(format_table(report))
    write_report(report, Path(args.out))
    save_config(cfg, Path(args.out).with_suffix(".config.yaml"))
    print(f"[bench] wrote {args.out}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.relay.engine import calibrate_for_engine, warm_up_for_engine

    cfg = load_config(args.config, args.override)
    model = RelayGRModel(cfg)
    if args.checkpoint:
        model.load_checkpoint(args.checkpoint)
    t0 = time.perf_counter()
    warm_up_for_engine(model, cfg, progress=lambda msg: print(f"[profile] {msg}", flush=True))
    latency = calibrate_for_engine(model, cfg, repeats=args.repeats)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    latency.to_json(args.out)
    print(f"[profile] {sum(1 for _ in latency.kinds)} kinds in {time.perf_counter() - t0:.0f} s -> {args.out} "
          f"(use it with -o trigger.latency_profile={args.out})")
    return 0


def _headline_spec(args: argparse.Namespace, cfg) -> Any:
    from mindspore_relaygr.bench.workload import WorkloadSpec

    max_len = min(args.max_len, cfg.model.max_seq_len - (1 if cfg.model.user_feature_sizes else 0))
    return WorkloadSpec(num_users=args.users, num_requests=args.requests, median_len=min(args.median_len, max_len),
                        max_len=max_len, min_len=min(64, max_len), gap_ms=args.gap_ms, min_gap_ms=args.min_gap_ms,
                        num_candidates=args.candidates,
                        zipf_a=args.zipf, num_items=cfg.model.num_items, num_actions=cfg.model.num_actions,
                        seed=args.seed)


def cmd_bench_headline(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import headline, plots
    from mindspore_relaygr.bench.model_bench import write_report

    fixed_slo = [] if args.slo_ms == "auto" else [f"trigger.slo_ms={args.slo_ms}"]
    cfg = load_config(args.config, [*fixed_slo, *args.override])
    if args.bench == "max-seq" and cfg.relay.miss_policy != "full":
        # A truncated rank does not serve the length under test: the relay's misses rank the whole history too.
        print(f"[bench] max-seq ranks every history whole: relay.miss_policy {cfg.relay.miss_policy} -> full")
        cfg = dataclasses.replace(cfg, relay=dataclasses.replace(cfg.relay, miss_policy="full"))
    spec = _headline_spec(args, cfg)
    say = lambda msg: print(f"[bench] {msg}", flush=True)  # noqa: E731
    model, latency = headline.prepare(cfg, say)
    user_tokens = 1 if cfg.model.user_feature_sizes else 0
    cap = min(args.cap_events, cfg.model.max_seq_len - user_tokens)
    at_cap = headline.time_full_path(model, cap, args.candidates, calls=args.cap_calls)
    say(f"full path at the {cap}-event cap: median {at_cap['median_ms']:.1f} ms of {at_cap['calls']} unloaded "
        f"calls (p90 {at_cap['p90_ms']:.1f}, max {at_cap['max_ms']:.1f})")
    slo_ms, slo_rule = cfg.trigger.slo_ms, {"rule": "fixed (--slo-ms)"}
    if args.slo_ms == "auto":
        slo_ms = headline.derive_slo_ms(at_cap["median_ms"])
        slo_rule = {"rule": f"{headline.SLO_FACTOR:g} x the median unloaded full path at the cap, rounded up to 5 ms",
                    "cap_events": cap, "full_ms_at_cap": at_cap["median_ms"]}
        cfg = dataclasses.replace(cfg, trigger=dataclasses.replace(cfg.trigger, slo_ms=slo_ms))
        say(f"SLO {slo_ms:g} ms = {headline.SLO_FACTOR:g} x that median, rounded up to 5 ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"spec": spec.__dict__, "config": str(args.config), "slo_ms": slo_ms,
                              "slo_rule": slo_rule, "cap_timing": {"cap_events": cap, "before": at_cap}}
    if args.bench == "slo-throughput":
        res = headline.slo_throughput(cfg, model, latency, spec, args.loads, slo_ms, args.time_limit, say,
                                      baseline_loads=args.baseline_loads)
        report["slo_throughput"] = res
        plots.plot_slo_throughput(res, out.with_suffix(".png"))
        if args.ablation:
            abl_spec = dataclasses.replace(spec, qps=args.ablation_qps)
            report["ablation"] = headline.ablation(cfg, model, latency, abl_spec, slo_ms, args.time_limit, say)
            plots.plot_ablation(report["ablation"], slo_ms, out.with_name(out.stem + "_ablation.png"))
    else:
        res = headline.max_seq(cfg, model, latency, spec, args.lengths, args.qps, slo_ms, args.time_limit, say,
                               baseline_lengths=args.baseline_lengths)
        report["max_seq"] = res
        plots.plot_max_seq(res, out.with_suffix(".png"))
    # The same timing after the sweep shows how far the machine drifted during the run.
    report["cap_timing"]["after"] = headline.time_full_path(model, cap, args.candidates, calls=args.cap_calls)
    print(headline.format_report(report))
    write_report(report, out)
    save_config(cfg, out.with_suffix(".config.yaml"))
    print(f"[bench] wrote {out} and plots next to it")
    return 0


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number > 0")
    return value


def _slo_arg(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--slo-ms {text!r}: expected a number of ms or 'auto'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"--slo-ms {text!r}: must be > 0")
    return value


def _add_headline_args(parser: argparse.ArgumentParser, default_out: str, median_len: int, max_len: int,
                       users: int = 150) -> None:
    _add_config_args(parser, "bench_long.yaml")
    parser.add_argument("--slo-ms", type=_slo_arg, default="auto",
                        help="ranking P99 budget in ms, or 'auto' (default): twice the calibrated full-path "
                             "latency at --cap-events, rounded up to 5 ms (see the model-zoo README)")
    parser.add_argument("--cap-events", type=int, default=1536,
                        help="production length cap of full inference, for --slo-ms auto")
    parser.add_argument("--cap-calls", type=positive_int, default=40,
                        help="unloaded full-path calls at the cap timed before and after the run")
    parser.add_argument("--requests", type=positive_int, default=MIN_RANKS,
                        help=f"requests (ranks) per point and mode; a P99 needs >= {MIN_RANKS}")
    parser.add_argument("--users", type=int, default=users)
    parser.add_argument("--median-len", type=int, default=median_len)
    parser.add_argument("--max-len", type=int, default=max_len)
    parser.add_argument("--candidates", type=int, default=128)
    # A 4096-event prefill takes ~0.5 s on this CPU: the gap keeps the paper's relation that the
    # pre-inference of the longest prefix usually finishes before the ranking request arrives.
    parser.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap")
    parser.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap (retrieval + pre-ranking)")
    parser.add_argument("--zipf", type=float, default=1.2, help="user revisit skew")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="stop each run after this many seconds (fewer ranks: a wider P99 interval)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=default_out)


CommandHook = Callable[[argparse._SubParsersAction, argparse._SubParsersAction], None]


def build_parser(extend: CommandHook | None = None) -> argparse.ArgumentParser:
    """The `relaygr` parser; `extend(commands, bench_commands)` adds commands from outside the library
    (serving/cli.py adds `serve`, `cluster`, `bench cluster` and `bench overload`: the library never imports
    `serving`)."""
    parser = argparse.ArgumentParser(prog="relaygr", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="prefill + rank one synthetic user both ways, compare scores")
    _add_config_args(demo, "tiny.yaml")
    demo.add_argument("--events", type=int, default=100)
    demo.add_argument("--suffix", type=int, default=8)
    demo.add_argument("--candidates", type=int, default=20)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="benchmarks (print a table, write JSON)")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    model = bench_sub.add_parser("model", help="full / prefill / cached latency, GFLOP/s and memory")
    _add_config_args(model, "bench_long.yaml")
    model.add_argument("--prefix-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    model.add_argument("--candidates", type=int, nargs="+", default=[64, 128, 256])
    model.add_argument("--suffix", type=int, default=32, help="short-term events computed at ranking time")
    model.add_argument("--repeats", type=int, default=10)
    model.add_argument("--batch", type=int, nargs="*", default=[],
                       help="also time this many users per call, e.g. 2 4 8: the cached path (rank_cached_batch) "
                            "and the last trigger.prefill_chunk_len-event prefill chunk (prefill_batch)")
    model.add_argument("--out", default="outputs/bench_model.json")
    model.set_defaults(func=cmd_bench_model)

    batching = bench_sub.add_parser("batching", help="ranks/s at saturation with ranks batched per device call or not")
    _add_config_args(batching, "bench_long.yaml")
    batching.add_argument("--users", type=int, default=8, help="users ranked, each with a device slot of its own")
    batching.add_argument("--clients", type=int, default=8, help="closed-loop client threads")
    batching.add_argument("--events", type=int, default=4096, help="history length (user token included)")
    batching.add_argument("--suffix", type=int, default=32, help="events after the pre-inferred prefix")
    batching.add_argument("--candidates", type=int, default=128)
    batching.add_argument("--batch", type=int, default=8, help="relay.max_rank_batch of the batched runs")
    batching.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    batching.add_argument("--rounds", type=int, default=3, help="pairs of runs, in alternating order")
    batching.add_argument("--low-qps", type=float, default=8.0,
                          help="low load: open-loop Poisson ranks per second after each closed-loop run (0: skip)")
    batching.add_argument("--low-requests", type=int, default=1000, help="ranks per low-load run")
    batching.add_argument("--out", default="outputs/bench_batching.json")
    batching.set_defaults(func=cmd_bench_batching)

    cache = bench_sub.add_parser("cache", help="DRAM reload vs recompute; pool cost vs number of slots")
    _add_config_args(cache, "bench_long.yaml")
    cache.add_argument("--prefix-lens", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    cache.add_argument("--slots", type=int, nargs="+", default=[16, 64, 256])
    cache.add_argument("--pool-prefix-len", type=int, default=1024,
                       help="slot capacity for the pool-size sweep (256 slots of 4096 tokens would need 8.6 GB)")
    cache.add_argument("--suffix", type=int, default=32)
    cache.add_argument("--repeats", type=int, default=10)
    cache.add_argument("--out", default="outputs/bench_cache.json")
    cache.set_defaults(func=cmd_bench_cache)

    engine = bench_sub.add_parser("engine", help="relay vs baseline engine under an open-loop cascade workload")
    _add_config_args(engine, "bench_long.yaml")
    engine.add_argument("--loads", type=float, nargs="+", default=[1.0, 2.0, 3.0], help="offered QPS levels")
    engine.add_argument("--requests", type=int, default=100, help="requests per load level and mode")
    engine.add_argument("--users", type=int, default=150)
    engine.add_argument("--median-len", type=int, default=1024)
    engine.add_argument("--max-len", type=int, default=4096)
    engine.add_argument("--candidates", type=int, default=128)
    engine.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap (as the headline)")
    engine.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap (retrieval + pre-ranking)")
    engine.add_argument("--time-limit", type=float, default=120.0, help="seconds per run (bounded load)")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument("--workload", default=None, metavar="FILE",
                        help="replay a saved timeline workload (relaygr workload timeline) instead of the synthetic "
                             "one; its arrivals are rescaled to each load, --max-len caps its histories")
    engine.add_argument("--out", default="outputs/bench_engine.json")
    engine.set_defaults(func=cmd_bench_engine)

    slo = bench_sub.add_parser("slo-throughput", help="highest QPS with rank P99 <= SLO: relay vs baseline")
    # Histories up to 1536 events: the production cap of the baseline, so both modes rank the same
    # histories. 1,000 ranks per point: a P99 with a usable interval. A point takes 1000 / QPS seconds
    # per mode, so the default loads keep the sweep near 25 minutes.
    _add_headline_args(slo, "outputs/slo_throughput.json", median_len=1024, max_len=1536)
    slo.add_argument("--loads", type=positive_float, nargs="+", default=[3.0, 6.0, 9.0, 12.0, 16.0],
                     help="offered QPS levels; the sweep goes on past them until both modes fail")
    slo.add_argument("--baseline-loads", type=positive_float, nargs="+", default=None, metavar="QPS",
                     help="the baseline's own QPS levels (default: --loads): its capacity is far below the "
                          "relay's, and a point at a low load takes 1000 / QPS seconds")
    slo.add_argument("--ablation", action="store_true", help="also run relay with each mechanism disabled")
    slo.add_argument("--ablation-qps", type=float, default=8.0, help="offered load of the ablation runs")
    slo.set_defaults(func=cmd_bench_headline)

    seq = bench_sub.add_parser("max-seq", help="longest history with rank P99 <= SLO at a fixed load (every rank "
                                                "on its whole history: relay.miss_policy is set to full)")
    # At 1 QPS a point of 1,000 ranks takes ~17 minutes per mode: fewer lengths, each with a P99 that holds.
    _add_headline_args(seq, "outputs/max_seq.json", median_len=2048, max_len=4096)
    seq.add_argument("--qps", type=positive_float, default=1.0, help="offered load of every point")
    seq.add_argument("--lengths", type=positive_int, nargs="+", default=[1024, 2048, 3072, 4095])
    seq.add_argument("--baseline-lengths", type=positive_int, nargs="+", default=None, metavar="EVENTS",
                     help="the baseline's own history lengths (default: --lengths): its longest compliant history "
                          "is far shorter than the relay's, and a point takes 1000 / QPS seconds")
    seq.set_defaults(func=cmd_bench_headline)

    from mindspore_relaygr.bench.revisit import register as register_revisit_bench
    from mindspore_relaygr.bench.timeline import register as register_workload
    from mindspore_relaygr.train.commands import register as register_train

    register_revisit_bench(bench_sub)
    register_train(sub)
    register_workload(sub)
    from mindspore_relaygr.bench.quality_at_slo import register as register_quality_at_slo

    register_quality_at_slo(bench_sub, positive_int, _slo_arg)
    if extend is not None:
        extend(sub, bench_sub)

    profile = sub.add_parser("profile", help="calibrate the latency model on the compiled graphs, write JSON")
    _add_config_args(profile, "bench_long.yaml")
    profile.add_argument("--checkpoint", default=None)
    profile.add_argument("--repeats", type=int, default=3)
    profile.add_argument("--out", default="outputs/latency_profile.json")
    profile.set_defaults(func=cmd_profile)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse, set up logging, run the chosen command; a RelayGRError is a one-line error, exit 2."""
    os.environ.setdefault("GLOG_v", "3")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except RelayGRError as exc:
        print(f"relaygr: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """The library's commands only; the `relaygr` console script is serving.cli:main (adds serving's)."""
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
