"""`relaygr bench overload`: what one instance does past its capacity, alone and behind nginx.

1. Saturation: closed-loop ranks from `--connections` client threads, straight to instance i0, for
   `--calibrate-s` seconds; the instance's saturating throughput is the ranks it served per second
   it was busy (at least one admitted rank in flight, from its `/v1/stats`). A connection whose rank
   is refused waits out the 503's Retry-After, as a client should: one that resends at once spins,
   and its refusals would eat the capacity being measured. While connections wait, the instance may
   run idle for moments; ranks per wall-clock second would then understate its capacity (a one-core
   instance read 15 ranks/s that way and served 19 per second open loop), ranks per busy second do
   not.
2. One instance: open-loop ranks (Poisson arrivals) straight to i0 at each multiple of that
   throughput (0.5x .. 3x), `--ranks` per point. Per point: goodput (200s answered within the SLO,
   per second of offered load), 503s and their latency, P50/P99 of the accepted ranks, other errors.
3. Two instances behind nginx: i0 is saturated by direct traffic (`--saturate` x its throughput)
   while users whose affinity key nginx hashes to i0 send about `--forwarded-ranks` ranks through
   nginx (at a quarter of one instance's throughput, while the direct load lasts); nginx must move
   the ranks i0 refuses to i1, which admits them against the whole SLO since no instance is left to
   try. Reported: which instance answered, failures at the client, their P99.

Ranks only (no pre-infer), so every rank is full inference: the heaviest request an instance serves.
Both instances and the client share this machine's cores, so part 3 measures the forwarding, not
added capacity. Everything binds 127.0.0.1; the cluster is stopped by PID in a `finally`.
"""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspore_relaygr.bench.loadgen import Outcome, percentile, run_open_loop
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig, load_config, save_config
from mindspore_relaygr.errors import ConfigError
from serving.cluster_bench import HOST, add_instance_config_args, at_load, check_workload, free_port_block
from serving.headers import encode_affinity
from serving.http_target import HTTPTarget, user_id

if TYPE_CHECKING:
    from mindspore_relaygr.relay.router import NginxConsistentHash
    from serving.cluster import ClusterSpec

DEFAULT_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def rank_workload(config: RelayGRConfig, num_requests: int, num_users: int, median_len: int,
                  num_candidates: int, seed: int) -> Workload:
    """Rank-only requests at 1 QPS (scaled per point with `at_load`); histories fit the model."""
    model = config.model
    max_len = model.max_seq_len - (1 if model.user_feature_sizes else 0)
    median = min(median_len, max_len)
    spec = WorkloadSpec(num_users=num_users, num_requests=num_requests, qps=1.0, median_len=median,
                        min_len=min(16, median), max_len=max_len, gap_ms=0.0, min_gap_ms=0.0,
                        num_candidates=num_candidates, growth_per_visit=0, num_items=model.num_items,
                        num_actions=model.num_actions, seed=seed)
    check_workload(config, spec)
    return Workload.generate(spec)


def users_routed_to(workload: Workload, ring: NginxConsistentHash, server: str) -> Workload:
    """The workload's requests whose user nginx hashes to `server` (their arrival times kept)."""
    keep = [r for r in workload.requests if ring.route(encode_affinity(user_id(r.user))) == server]
    return Workload(workload.spec, workload.base_lens, keep, workload.max_visits)


def point_summary(outcomes: list[Outcome], offered_rps: float, slo_ms: float) -> dict[str, Any]:
    """Goodput, rejections and the accepted ranks' latency of one open-loop run."""
    ranks = [o for o in outcomes if o.kind == "rank"]
    span_s = max(o.scheduled_s for o in ranks) - min(o.scheduled_s for o in ranks) if len(ranks) > 1 else 0.0
    accepted = [o.latency_ms for o in ranks if o.status == 200]
    tiers = Counter(o.tier for o in ranks if o.status == 200)  # device, dram, ... or miss (the full path)
    rejected = [o.latency_ms for o in ranks if o.status == 503]
    good = sum(1 for ms in accepted if ms <= slo_ms)
    return {
        "offered_rps": offered_rps,
        "achieved_offered_rps": len(ranks) / span_s if span_s > 0 else float("nan"),
        "ranks": len(ranks),
        "accepted": len(accepted),
        "goodput_rps": good / span_s if span_s > 0 else float("nan"),
        "within_slo": good,
        "rejected_503": len(rejected),
        "reject_p50_ms": percentile(rejected, 50) if rejected else None,
        "reject_p99_ms": percentile(rejected, 99) if rejected else None,
        "accepted_p50_ms": percentile(accepted, 50) if accepted else None,
        "accepted_p99_ms": percentile(accepted, 99) if accepted else None,
        "accepted_max_ms": max(accepted, default=None),
        "accepted_tiers": dict(sorted(tiers.items())),
        "other_errors": sum(1 for o in ranks if o.status not in (200, 503)),
        "error_samples": sorted({o.error or str(o.status) for o in ranks if o.status not in (200, 503)})[:3],
    }


def saturating_throughput(url: str, workload: Workload, connections: int, seconds: float,
                          retry_after_s: float) -> dict[str, Any]:
    """Closed loop: `connections` threads send ranks back to back (a refused one waits `retry_after_s`, the
    instances' Retry-After); served 200s per second."""
    target = HTTPTarget(url, workload)
    target.prepare(workload.requests)
    stop_at = time.perf_counter() + seconds
    counts = {"ok": 0, "rejected": 0, "other": 0}
    lock = threading.Lock()

    def loop(offset: int) -> None:
        i = offset
        while time.perf_counter() < stop_at:
            _, _, status = target.rank(workload.requests[i % len(workload.requests)])
            key = "ok" if status == 200 else "rejected" if status == 503 else "other"
            with lock:
                counts[key] += 1
            if status == 503:
                time.sleep(retry_after_s)
            i += connections

    t0 = time.perf_counter()
    threads = [threading.Thread(target=loop, args=(k,)) for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    target.close()
    return {"rps": counts["ok"] / elapsed, "seconds": elapsed, "connections": connections, **counts}


def capacity(url: str, closed_loop: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `closed_loop()` (a `saturating_throughput` call against the instance at `url`) and add the
    instance's own count: `served` ranks and `busy_s` seconds with a rank in flight over the run, and
    `capacity_rps` = served / busy_s (the wall-clock `rps` when the instance has no admission control)."""
    before = admission_view(url)
    out = closed_loop()
    after = admission_view(url)
    served = after.get("served", 0) - before.get("served", 0)
    busy_s = after.get("busy_s", 0.0) - before.get("busy_s", 0.0)
    return {**out, "served": served, "busy_s": busy_s,
            "capacity_rps": served / busy_s if served > 0 and busy_s > 0 else out["rps"]}


def open_loop(url: str, workload: Workload, rps: float, max_workers: int) -> tuple[list[Outcome], HTTPTarget]:
    """One open-loop run of the workload's ranks at `rps` against `url`."""
    scaled = at_load(workload, rps)
    target = HTTPTarget(url, scaled)
    target.prepare(scaled.requests)
    try:
        outcomes = run_open_loop(scaled, None, target.rank, max_workers=max_workers)
    finally:
        target.close()
    return outcomes, target


@dataclass(frozen=True)
class OverloadSpec:
    """What `relaygr bench overload` runs."""

    config_path: str
    run_dir: Path
    overrides: tuple[str, ...] = ()
    multiples: tuple[float, ...] = DEFAULT_MULTIPLES
    ranks: int = 1500  # per load point
    saturate: float = 2.0  # direct load on i0 in the forwarding run, x its saturating throughput
    forwarded_ranks: int = 1000  # ranks of i0's users sent through nginx in the forwarding run (about)
    connections: int = 16  # closed-loop clients of the saturation run
    calibrate_s: float = 10.0
    max_workers: int = 64  # client threads of the open-loop runs
    median_len: int = 96
    num_candidates: int = 32
    engine_factory: str | None = None  # tests of the harness: a fake engine instead of RelayEngine
    pin_cpus: bool = False  # one core per instance (ClusterSpec.pin_cpus)

    def __post_init__(self) -> None:
        if self.ranks < 2 or self.forwarded_ranks < 2 or not self.multiples or min(self.multiples) <= 0 \
                or self.saturate <= 0:
            raise ConfigError("ranks and forwarded_ranks must be >= 2, multiples and saturate positive")


ROUTED_SHARE = 0.25  # rate of the forwarding run's nginx stream, x one instance's saturating throughput
ROUTED_SPAN = 0.8  # part of the direct load's duration the nginx stream runs in


def run_overload_bench(bench: OverloadSpec, say: Callable[[str], None]) -> dict[str, Any]:
    """The three parts of the module docstring; the cluster (nginx + 2 instances) is always stopped."""
    from serving.cluster import Cluster, ClusterSpec

    config = load_config(bench.config_path, list(bench.overrides))
    slo_ms = config.trigger.slo_ms
    workload = rank_workload(config, bench.ranks, 200, bench.median_len, bench.num_candidates, seed=0)
    spec = ClusterSpec(port=free_port_block(3), num_instances=2, run_dir=bench.run_dir,
                       config_path=bench.config_path, overrides=bench.overrides, host=HOST, read_timeout_s=30.0,
                       max_conns=config.serving.threads,
                       engine_factory=bench.engine_factory, pin_cpus=bench.pin_cpus)
    cluster = Cluster(spec)
    report: dict[str, Any] = {"config": bench.config_path, "overrides": list(bench.overrides), "slo_ms": slo_ms,
                              "admission_fraction": config.relay.admission_fraction,
                              "threads": config.serving.threads, "pin_cpus": bench.pin_cpus,
                              "cpu_sets": {i: sorted(spec.cpu_set(k) or []) for k, i in enumerate(spec.instance_ids)},
                              "spec": asdict(workload.spec)}
    try:
        say(f"starting nginx + 2 instances (logs in {bench.run_dir / 'logs'})")
        cluster.start(1800.0)
        direct = f"http://{HOST}:{spec.instance_ports[0]}"
        via_nginx = f"http://{HOST}:{spec.port}"
        saturation_workload = rank_workload(config, 400, 200, bench.median_len, bench.num_candidates, seed=1)
        retry_after_s = config.serving.retry_after_s
        saturating_throughput(direct, saturation_workload, bench.connections, min(bench.calibrate_s, 3.0),
                              retry_after_s)  # warm the path
        sat = capacity(direct, lambda: saturating_throughput(direct, saturation_workload, bench.connections,
                                                             bench.calibrate_s, retry_after_s))
        peak = sat["capacity_rps"]
        report["saturation"] = sat
        say(f"saturating throughput of one instance: {peak:.1f} ranks per busy second ({sat['served']} ranks in "
            f"{sat['busy_s']:.1f} busy s of {sat['seconds']:.1f} s; {sat['rps']:.1f} ranks/s of wall clock from "
            f"{bench.connections} closed-loop connections, {sat['rejected']} refused)")
        rows = []
        for m in bench.multiples:
            outcomes, _ = open_loop(direct, workload, m * peak, bench.max_workers)
            row = {"multiple": m, **point_summary(outcomes, m * peak, slo_ms)}
            rows.append(row)
            say(point_line(row))
        report["single"] = rows
        # The routed stream runs at ROUTED_SHARE of one instance's throughput during ROUTED_SPAN of the
        # direct load (at `saturate` x that throughput): the direct load needs this many ranks.
        direct_ranks = math.ceil(bench.forwarded_ranks * bench.saturate / (ROUTED_SHARE * ROUTED_SPAN))
        direct_workload = rank_workload(config, direct_ranks, 200, bench.median_len, bench.num_candidates, seed=2)
        report["forwarding"] = forwarding_run(spec, direct_workload, direct, via_nginx, bench.saturate * peak, peak,
                                              bench.max_workers, slo_ms, say)
    finally:
        cluster.stop()
    return report


def forwarding_run(spec: ClusterSpec, workload: Workload, direct: str, via_nginx: str, saturating_rps: float,
                   peak_rps: float, max_workers: int, slo_ms: float, say: Callable[[str], None]) -> dict[str, Any]:
    """i0 saturated directly (`saturating_rps`) while its users' ranks go through nginx at ROUTED_SHARE of
    one instance's throughput (`peak_rps`) during the middle ROUTED_SPAN of the direct load."""
    routed = users_routed_to(workload, spec.ring(), spec.servers[0])
    share = len(routed.requests) / max(len(workload.requests), 1)  # of the workload's 1-QPS arrivals
    routed_rps = ROUTED_SHARE * peak_rps
    direct_s = workload.requests[-1].at_s / saturating_rps  # how long the direct load lasts
    lasts_s = ROUTED_SPAN * direct_s  # started 10% in, ends before the direct load does
    scaled = at_load(routed, routed_rps / max(share, 1e-9))
    routed = Workload(routed.spec, routed.base_lens, [r for r in scaled.requests if r.at_s < lasts_s],
                      routed.max_visits)
    results: dict[str, Any] = {}

    def saturate() -> None:
        results["direct"] = open_loop(direct, workload, saturating_rps, max_workers)

    instances = {f"i{k}": f"http://{HOST}:{port}" for k, port in enumerate(spec.instance_ports)}
    before = {name: admission_counts(url) for name, url in instances.items()}
    loader = threading.Thread(target=saturate)
    loader.start()
    time.sleep(0.1 * direct_s)  # i0 is saturated before the routed ranks start
    outcomes, target = open_loop(via_nginx, routed, routed.spec.qps, max_workers)
    loader.join()
    direct_outcomes, _ = results["direct"]
    after = {name: admission_counts(url) for name, url in instances.items()}
    row = {"direct_rps": saturating_rps, "direct": point_summary(direct_outcomes, saturating_rps, slo_ms),
           "via_nginx": point_summary(outcomes, routed_rps, slo_ms),
           "via_nginx_failed": sum(1 for o in outcomes if o.status != 200),
           "via_nginx_instances": target.instance_counts().get("rank", {}),
           "admission": {name: {k: after[name][k] - before[name][k] for k in ADMISSION_COUNTS}
                         for name in instances}}
    p99 = row["via_nginx"]["accepted_p99_ms"]
    i1 = row["admission"].get("i1", {})
    say(f"forwarding: i0 at {saturating_rps:.0f} ranks/s direct ({row['direct']['rejected_503']} x 503); "
        f"{row['via_nginx']['ranks']} ranks of i0's users through nginx answered by {row['via_nginx_instances']}, "
        f"{row['via_nginx_failed']} failed, P99 {'-' if p99 is None else f'{p99:.1f}'} ms; i1 admitted "
        f"{i1.get('admitted')} ({i1.get('admitted_last_resort')} on their last try over the normal budget), "
        f"refused {i1.get('rejected')}")
    return row


ADMISSION_COUNTS = ("admitted", "rejected", "admitted_last_resort")


def admission_view(url: str) -> dict[str, Any]:
    """An instance's admission view from `/v1/stats` (empty when admission control is off)."""
    import json
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/v1/stats", timeout=30) as resp:
        return json.loads(resp.read()).get("admission") or {}


def admission_counts(url: str) -> dict[str, int]:
    """An instance's admission counters from `/v1/stats` (zeros when admission control is off)."""
    admission = admission_view(url)
    return {k: int(admission.get(k, 0)) for k in ADMISSION_COUNTS}


def point_line(r: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"
    return (f"{r['multiple']:>4g}x {r['offered_rps']:>7.1f}/s | goodput {r['goodput_rps']:>6.1f}/s | "
            f"accepted {r['accepted']:>5} p50 {ms(r['accepted_p50_ms']):>6} p99 {ms(r['accepted_p99_ms']):>6} ms | "
            f"503 {r['rejected_503']:>5} p50 {ms(r['reject_p50_ms']):>5} ms | other {r['other_errors']}")


def format_report(report: dict[str, Any]) -> str:
    sat = report["saturation"]
    lines = [f"one instance, SLO {report['slo_ms']:g} ms, admission fraction {report['admission_fraction']}, "
             f"{report['threads']} server threads; saturating throughput {sat['capacity_rps']:.1f} ranks per busy "
             f"second ({sat['rps']:.1f} per wall-clock second of the closed loop)",
             f"{'load':>5} {'offered':>9} | {'goodput':>15} | accepted, p50 and p99 | 503s and their p50 | other"]
    lines += [point_line(r) for r in report["single"]]
    peak = max(r["goodput_rps"] for r in report["single"])
    lines.append(f"peak goodput {peak:.1f} ranks/s")
    f = report["forwarding"]
    lines.append(f"behind nginx: i0 saturated at {f['direct_rps']:.0f}/s; i0's users through nginx: "
                 f"{f['via_nginx']['ranks']} ranks, answered by {f['via_nginx_instances']}, "
                 f"{f['via_nginx_failed']} failed, P99 {f['via_nginx']['accepted_p99_ms'] or float('nan'):.1f} ms")
    return "\n".join(lines)


def register(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `relaygr bench overload` to the `relaygr bench` subcommands."""
    p = bench_subparsers.add_parser("overload", help="goodput, 503s and tail latency of one instance from 0.5x to "
                                                     "3x its saturating throughput, and forwarding behind nginx")
    add_instance_config_args(p, "tiny")
    p.add_argument("--multiples", type=float, nargs="+", default=list(DEFAULT_MULTIPLES),
                   help="offered loads as multiples of the saturating throughput")
    p.add_argument("--ranks", type=int, default=1500, help="ranks per load point (>= 1000 for a P99)")
    p.add_argument("--saturate", type=float, default=2.0, help="direct load on i0 in the forwarding run (x peak)")
    p.add_argument("--forwarded-ranks", type=int, default=1000,
                   help="ranks of the saturated instance's users sent through nginx in the forwarding run")
    p.add_argument("--connections", type=int, default=16, help="closed-loop clients of the saturation run")
    p.add_argument("--calibrate-s", type=float, default=10.0, help="length of the saturation run (s)")
    p.add_argument("--max-workers", type=int, default=64, help="client threads of the open-loop runs")
    p.add_argument("--median-len", type=int, default=96, help="median history length of the ranks")
    p.add_argument("--candidates", type=int, default=32)
    p.add_argument("--pin-cpus", action="store_true",
                   help="one core per instance (as one device per instance): the forwarding run then measures "
                        "forwarding, not two instances contending for the same cores")
    p.add_argument("--engine-factory", default=None, metavar="MODULE:CALLABLE",
                   help="build the instances' engines with this instead of RelayEngine (tests of the harness)")
    p.add_argument("--out", default="outputs/bench_overload.json")
    p.set_defaults(func=cmd_bench_overload)


def cmd_bench_overload(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.machine import machine_info
    from mindspore_relaygr.bench.model_bench import write_report

    out = Path(args.out)
    say = lambda msg: print(f"[overload] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    run_dir = out.with_name(out.stem + "_run").resolve()
    bench = OverloadSpec(config_path=str(Path(args.config).resolve()), run_dir=run_dir,
                         overrides=tuple(args.override), multiples=tuple(args.multiples), ranks=args.ranks,
                         saturate=args.saturate, forwarded_ranks=args.forwarded_ranks,
                         connections=args.connections, calibrate_s=args.calibrate_s,
                         max_workers=args.max_workers, median_len=args.median_len, num_candidates=args.candidates,
                         engine_factory=args.engine_factory, pin_cpus=args.pin_cpus)
    machine = machine_info()  # before the servers start: measured after they stop, the CPU is still busy
    from serving.cluster import sigterm_interrupts

    with sigterm_interrupts():  # SIGTERM stops nginx and the instances, like Ctrl-C
        report = run_overload_bench(bench, say)
    out.parent.mkdir(parents=True, exist_ok=True)
    report["machine"] = machine
    write_report(report, out)
    save_config(load_config(bench.config_path, list(bench.overrides)), out.with_suffix(".config.yaml"))
    plots.plot_overload(report, out.with_suffix(".png"))
    print(format_report(report))
    print(f"[overload] wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.config.yaml')}")
    return 0

