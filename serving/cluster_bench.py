"""`relaygr bench cluster`: open-loop load against the HTTP cluster (N instances behind nginx).

One workload (generated, or a saved one with --workload) is replayed at every offered load: the
same users, histories, gaps and candidates, with the arrival times scaled to the load. Modes:

* baseline — instances with the relay disabled: full inference of the whole history (up to the
  workload's longest, `relay.max_online_len=max_len`) on the ranking path; no pre-infer is sent.
* relay — pre-infer at retrieval time, rank from the cache; nginx hashes on X-RelayGR-Affinity,
  so a user's pre-infer and rank meet on one instance.
* relay_no_affinity — the same relay instances, but nginx sends every request to a random
  instance (`random;`): the ablation that shows what affinity buys.

baseline runs on its own instances; the two relay modes share one set (nginx is reloaded between
them). Every run starts and ends with a flush of every instance's caches, after the admitted
prefills have finished, so a run never sees another's cache and relayed prefixes that no rank
used are counted as wasted. Engine counters come from each instance's /v1/stats, diffed around
the run. With --order interleaved (the default) both sets stay up and the mode order reverses from
one load to the next, so machine drift hits every mode; --order grouped runs one set after the
other (half the processes and memory at a time, but drift can favour a mode).

Start-up cost: each instance imports MindSpore, builds the model, compiles every bucket
(relay.warmup, keep it on for measurements: otherwise the first requests pay the compilation)
and calibrates its latency model — unless --profile names a profile from `relaygr profile`,
which skips the calibration. The instances of a set start in parallel; the measured start-up time
of each set is in the report. Everything binds 127.0.0.1 and every cluster is stopped by PID in a
`finally`.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import requests

from mindspore_relaygr.bench.loadgen import Outcome, run_open_loop, summarize
from mindspore_relaygr.bench.tailstats import compliant_value, complies
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import RelayGRConfig, load_config, save_config
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.shipped_configs import config_arg, config_help
from serving.http_target import HTTPTarget

Progress = Callable[[str], None]
HOST = "127.0.0.1"
MODES = ("baseline", "relay", "relay_no_affinity")
# mode -> (instance set, nginx balancing, pre-infer sent)
MODE_SETUP = {"baseline": ("baseline", "affinity", False), "relay": ("relay", "affinity", True),
              "relay_no_affinity": ("relay", "random", True)}
ORDERS = ("interleaved", "grouped")


# ---------------------------------------------------------------------- plan and workload
def plan_runs(loads: list[float], modes: list[str], order: str) -> list[tuple[float, str]]:
    """(offered QPS, mode) in run order. interleaved: load by load, the mode order reversing from
    one load to the next (A B C, C B A, ...: over two loads every mode runs before and after every
    other, so a monotonic drift favours none); grouped: the baseline set's runs first, then the
    relay set's (still alternating)."""
    runs = []
    for i, qps in enumerate(loads):
        runs += [(qps, mode) for mode in (modes if i % 2 == 0 else modes[::-1])]
    if order == "grouped":
        runs.sort(key=lambda run: MODE_SETUP[run[1]][0] != "baseline")  # stable: keeps the alternation
    return runs


def at_load(workload: Workload, qps: float) -> Workload:
    """The same requests with the arrival times scaled from the workload's rate to `qps`."""
    factor = workload.spec.qps / qps
    reqs = [replace(r, at_s=r.at_s * factor) for r in workload.requests]
    return Workload(replace(workload.spec, qps=qps), workload.base_lens, reqs, workload.max_visits)


def check_workload(config: RelayGRConfig, spec: WorkloadSpec) -> None:
    """Every request of the workload must be valid for the model (else every call would be a 400)."""
    model = config.model
    capacity = model.max_seq_len - (1 if model.user_feature_sizes else 0)
    for ok, what in ((spec.max_len <= capacity, f"max_len={spec.max_len} > {capacity} events the model takes"),
                     (spec.num_items <= model.num_items, f"num_items={spec.num_items} > model {model.num_items}"),
                     (spec.num_actions <= model.num_actions,
                      f"num_actions={spec.num_actions} > model {model.num_actions}"),
                     (spec.num_candidates <= model.max_candidates,
                      f"num_candidates={spec.num_candidates} > model max {model.max_candidates}")):
        if not ok:
            raise ConfigError(f"workload does not fit the model: {what}")


def set_overrides(name: str, slo_ms: float, max_len: int, overrides: list[str], profile: str | None) -> list[str]:
    """Instance overrides of a set: the SLO, no admission control (the benchmark measures how the tail
    grows with load; a refused rank would hide it), the user's -o, the profile, then what makes the set."""
    out = [f"trigger.slo_ms={slo_ms}", "relay.admission_fraction=null", *overrides]
    if profile:
        out.append(f"trigger.latency_profile={Path(profile).resolve()}")
    if name == "baseline":
        out += ["relay.enabled=false", f"relay.max_online_len={max_len}"]
    return out


def free_port_block(n: int, host: str = HOST) -> int:
    """A base port such that base..base+n-1 are free on `host` right now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {n} free ports on {host}")


# ---------------------------------------------------------------------- one set of instances
@dataclass
class InstanceSet:
    """One cluster (nginx + instances) and the admin calls a run makes on each instance directly."""

    name: str
    spec: Any  # serving.cluster.ClusterSpec
    admin_token: str | None = None
    startup_s: float = 0.0
    cluster: Any = field(default=None, repr=False)
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def __post_init__(self) -> None:
        self.session.trust_env = False  # loopback only

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def instance_urls(self) -> list[str]:
        return [f"http://{self.spec.host}:{p}" for p in self.spec.instance_ports]

    def start(self, ready_timeout_s: float) -> None:
        from serving.cluster import Cluster

        self.spec = replace(self.spec, port=free_port_block(self.spec.num_instances + 1))  # free right now
        self.cluster = Cluster(self.spec)
        t0 = time.perf_counter()
        self.cluster.start(ready_timeout_s)  # stops what it started if it fails
        self.startup_s = time.perf_counter() - t0

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        self.session.close()

    def set_balance(self, balance: str) -> None:
        self.cluster.set_balance(balance)

    def stats(self) -> list[dict[str, Any]]:
        out = []
        for url in self.instance_urls:
            resp = self.session.get(f"{url}/v1/stats", timeout=(2, 30))
            resp.raise_for_status()
            body = resp.json()
            if body.get("engine") is None:
                raise RuntimeError(f"{url} has no engine stats (state {body.get('state')})")
            out.append(body)
        return out

    def settle(self, timeout_s: float) -> None:
        """Wait until no instance has queued ranks or pending prefills."""
        deadline = time.monotonic() + timeout_s
        while True:
            busy = [s["instance"] for s in self.stats()
                    if s["engine"].get("pending_prefills", 0) or s["engine"].get("queue_depth", 0)]
            if not busy:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"instances {busy} still busy after {timeout_s:g} s")
            time.sleep(0.1)

    def flush(self) -> None:
        hdrs = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        for url in self.instance_urls:
            self.session.post(f"{url}/v1/admin/flush", headers=hdrs, timeout=(2, 60)).raise_for_status()

    def counters(self) -> dict[str, dict[str, int]]:
        """{instance id: engine counters}."""
        return {s["instance"]: dict(s["engine"]["counters"]) for s in self.stats()}


def diff_counters(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    out = {}
    for inst, now in after.items():
        then = before.get(inst, {})
        out[inst] = {k: int(v) - int(then.get(k, 0)) for k, v in now.items() if int(v) != int(then.get(k, 0))}
    return out


# ---------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunOptions:
    time_limit_s: float | None = None
    max_workers: int = 32
    settle_timeout_s: float = 600.0
    top_k: int = 10


def run_point(iset: InstanceSet, workload: Workload, mode: str, opts: RunOptions) -> dict[str, Any]:
    """One open-loop run of `workload` in `mode` on `iset`, with the engine counters diffed around it."""
    _, balance, send_preinfer = MODE_SETUP[mode]
    iset.set_balance(balance)
    iset.settle(opts.settle_timeout_s)
    iset.flush()
    before = iset.counters()
    target = HTTPTarget(iset.url, workload, top_k=opts.top_k)
    try:
        target.prepare(workload.requests)
        t0 = time.perf_counter()
        outcomes = run_open_loop(workload, target.preinfer if send_preinfer else None, target.rank,
                                 max_workers=opts.max_workers, time_limit_s=opts.time_limit_s)
        wall_s = time.perf_counter() - t0
    finally:
        target.close()
    iset.settle(opts.settle_timeout_s)
    iset.flush()  # relayed prefixes no rank used are evicted now: counted as wasted
    per_instance = diff_counters(before, iset.counters())
    return {"mode": mode, "balance": balance, **summarize_run(outcomes, workload.spec.qps, per_instance, target),
            "wall_s": wall_s}


def summarize_run(outcomes: list[Outcome], qps: float, per_instance: dict[str, dict[str, int]],
                  target: HTTPTarget) -> dict[str, Any]:
    summary = summarize(outcomes, qps)
    ok_ranks = max(sum(summary["tiers"].values()), 1)
    summary["tier_rates"] = {tier: n / ok_ranks for tier, n in summary["tiers"].items()}
    summary["preinfers"] = sum(1 for o in outcomes if o.kind == "preinfer")
    summary["rank_statuses"] = {str(k): v for k, v in Counter(o.status for o in outcomes if o.kind == "rank").items()}
    summary["error_samples"] = [e for e, _ in Counter(o.error for o in outcomes if o.error).most_common(3)]
    engine: Counter[str] = Counter()
    for counters in per_instance.values():
        engine.update(counters)
    summary["engine"] = dict(engine)
    summary["wasted_prefills"] = engine.get("wasted_prefills", 0)
    summary["engine_trigger"] = {k.removeprefix("preinfer_"): v for k, v in engine.items() if k.startswith("preinfer_")}
    summary["per_instance"] = {
        inst: {"ranks": sum(v for k, v in c.items() if k.startswith("rank_")),
               "preinfers": sum(v for k, v in c.items() if k.startswith("preinfer_")),
               "prefills": c.get("prefills", 0)}
        for inst, c in sorted(per_instance.items())}
    summary["client_instances"] = target.instance_counts()
    summary["colocated"] = target.colocated_fraction()
    return summary


# ---------------------------------------------------------------------- the benchmark
@dataclass(frozen=True)
class ClusterBenchSpec:
    """What `relaygr bench cluster` runs (everything but the workload)."""

    config_path: str
    overrides: tuple[str, ...] = ()
    num_instances: int = 2
    loads: tuple[float, ...] = (1.0, 2.0)
    modes: tuple[str, ...] = MODES
    order: str = "interleaved"
    slo_ms: float = 150.0
    profile: str | None = None
    run_root: Path = Path("outputs/bench_cluster_run")
    engine_factory: str | None = None  # tests of the harness: a fake engine instead of RelayEngine
    read_timeout_s: float = 120.0  # nginx proxy_read_timeout: above any queueing we want to measure
    ready_timeout_s: float = 1800.0
    run: RunOptions = RunOptions()

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes or len(set(self.modes)) != len(self.modes):
            raise ConfigError(f"modes={list(self.modes)}: must be distinct values of {MODES}")
        if self.order not in ORDERS:
            raise ConfigError(f"order={self.order!r}: must be one of {ORDERS}")
        if not self.loads or min(self.loads) <= 0:
            raise ConfigError(f"loads={list(self.loads)}: must be positive QPS values")
        if self.num_instances < 1:
            raise ConfigError(f"num_instances={self.num_instances}: must be >= 1")


def make_set(name: str, bench: ClusterBenchSpec, config: RelayGRConfig, max_len: int) -> InstanceSet:
    """The set's cluster spec (its ports are picked again when it starts)."""
    from serving.cluster import ClusterSpec
    from serving.settings import resolve_settings

    settings = resolve_settings(config)
    overrides = set_overrides(name, bench.slo_ms, max_len, list(bench.overrides), bench.profile)
    spec = ClusterSpec(port=free_port_block(bench.num_instances + 1), num_instances=bench.num_instances,
                       run_dir=Path(bench.run_root) / name, config_path=bench.config_path, overrides=tuple(overrides),
                       host=HOST, read_timeout_s=bench.read_timeout_s, max_body_bytes=settings.max_content_length,
                       max_conns=settings.threads,
                       engine_factory=bench.engine_factory)
    return InstanceSet(name, spec, admin_token=settings.admin_token)


def run_cluster_bench(bench: ClusterBenchSpec, config: RelayGRConfig, workload: Workload,
                      progress: Progress) -> dict[str, Any]:
    """Every (load, mode) run of the plan; a set's cluster starts before its first run and stops
    after its last (and always, in a finally)."""
    runs = plan_runs(list(bench.loads), list(bench.modes), bench.order)
    sets = {MODE_SETUP[m][0]: make_set(MODE_SETUP[m][0], bench, config, workload.spec.max_len) for m in bench.modes}
    last_use = {name: max(i for i, (_, m) in enumerate(runs) if MODE_SETUP[m][0] == name) for name in sets}
    rows = []
    try:
        for i, (qps, mode) in enumerate(runs):
            iset = sets[MODE_SETUP[mode][0]]
            if iset.cluster is None:
                progress(f"starting the {iset.name} set: {bench.num_instances} instances (logs in "
                         f"{iset.spec.run_dir / 'logs'})")
                iset.start(bench.ready_timeout_s)
                progress(f"{iset.name} set ready in {iset.startup_s:.0f} s: nginx on {iset.url}, instances on "
                         f"{', '.join(iset.spec.servers)}")
            row = run_point(iset, at_load(workload, qps), mode, bench.run)
            row["complies"] = complies(row, bench.slo_ms)
            rows.append(row)
            progress(progress_line(i + 1, len(runs), row))
            if last_use[iset.name] == i:
                iset.stop()
    finally:
        for iset in sets.values():
            iset.stop()
    # The headline rule (tailstats): the top of the unbroken compliant run of loads from below.
    compliant = {m: compliant_value([r for r in rows if r["mode"] == m], "offered_qps", bench.slo_ms)
                 for m in bench.modes}
    return {"slo_ms": bench.slo_ms, "num_instances": bench.num_instances, "modes": list(bench.modes),
            "loads": list(bench.loads), "order": bench.order, "config": bench.config_path,
            "overrides": {name: list(s.spec.overrides) for name, s in sets.items()},
            "startup_s": {name: s.startup_s for name, s in sets.items()}, "spec": asdict(workload.spec),
            "revisit_fraction": workload.revisit_fraction(), "results": rows, "compliant_qps": compliant}


def progress_line(done: int, total: int, r: dict[str, Any]) -> str:
    coloc = "-" if r["colocated"] is None else f"{r['colocated']:.2f}"
    return (f"[{done}/{total}] {r['offered_qps']:g} QPS {r['mode']:>17}: p50 {r['p50_ms']:.0f} ms, "
            f"p99 {r['p99_ms']:.0f} ms, hit rate {r['hit_rate']:.2f}, co-located {coloc}, "
            f"errors {r['errors']}, 503 {r['rejected_503']}, wasted {r['wasted_prefills']} ({r['wall_s']:.0f} s)")


def format_table(report: dict[str, Any]) -> str:
    head = (f"{'QPS':>5} {'mode':>17} | {'achieved':>8} | {'p50':>6} {'p90':>6} {'p99':>6} {'max':>6} ok | "
            f"{'err':>4} {'503':>4} | {'hit':>5} {'coloc':>5} {'trunc':>5} {'wasted':>6} | ranks per instance | "
            "tiers / trigger")
    lines = [f"HTTP cluster, {report['num_instances']} instances behind nginx; SLO {report['slo_ms']:g} ms "
             f"(latencies in ms, rank path, from the scheduled send time)", head, "-" * len(head)]
    for r in sorted(report["results"], key=lambda r: (r["offered_qps"], report["modes"].index(r["mode"]))):
        coloc = "-" if r["colocated"] is None else f"{r['colocated']:.2f}"
        per = " ".join(f"{k}:{v['ranks']}" for k, v in r["per_instance"].items())
        extra = {**r["tiers"], **{f"t:{k}": v for k, v in r["trigger"].items()}}
        lines.append(f"{r['offered_qps']:>5g} {r['mode']:>17} | {r['achieved_qps']:>8.2f} | {r['p50_ms']:>6.0f} "
                     f"{r['p90_ms']:>6.0f} {r['p99_ms']:>6.0f} {r['max_ms']:>6.0f} {'y ' if r['complies'] else 'n '} | "
                     f"{r['errors']:>4} {r['rejected_503']:>4} | {r['hit_rate']:>5.2f} {coloc:>5} "
                     f"{r['truncations']:>5} {r['wasted_prefills']:>6} | {per} | {extra}")
    compliant = ", ".join(f"{m} {q:g}" for m, q in report["compliant_qps"].items())
    lines.append(f"SLO-compliant QPS (every load up to it: P99 upper bound <= SLO, no errors or 503s): {compliant}")
    lines.append("start-up: " + ", ".join(f"{k} set {v:.0f} s" for k, v in report["startup_s"].items()))
    return "\n".join(lines)


# ---------------------------------------------------------------------- command line
def add_instance_config_args(p: argparse.ArgumentParser, default_config: str) -> None:
    """--config and -o of a benchmark that starts its own instances (`default_config`: a shipped config's name)."""
    p.add_argument("--config", type=config_arg, default=default_config, help=config_help(" (the instances')"))
    p.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value of every instance (repeatable), e.g. -o context.num_threads=1")


def register(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `relaygr bench cluster` to the `relaygr bench` subcommands."""
    p = bench_subparsers.add_parser("cluster", help="open-loop load on N HTTP instances behind nginx: baseline, "
                                                    "relay and relay without affinity (random instance)")
    add_instance_config_args(p, "bench_long")
    p.add_argument("--instances", type=int, default=2, help="instances per cluster")
    p.add_argument("--loads", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0], help="offered QPS levels")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--order", choices=ORDERS, default="interleaved",
                   help="interleaved: both instance sets up, the mode order reverses per load (drift hits all modes); "
                        "grouped: one set at a time (half the memory)")
    p.add_argument("--slo-ms", type=float, default=None, help="ranking P99 budget (default: the config's "
                                                               "trigger.slo_ms)")
    p.add_argument("--profile", default=None, help="latency profile JSON from `relaygr profile` (skips each "
                                                   "instance's calibration at start-up)")
    p.add_argument("--workload", default=None, help="replay a saved workload (JSON from a previous run) instead of "
                                                    "generating one")
    p.add_argument("--num-requests", type=int, default=80, help="requests per run")
    p.add_argument("--users", type=int, default=60)
    p.add_argument("--median-len", type=int, default=768)
    p.add_argument("--max-len", type=int, default=1536)
    p.add_argument("--candidates", type=int, default=128)
    p.add_argument("--gap-ms", type=float, default=600.0, help="mean retrieval -> ranking gap (as the headline)")
    p.add_argument("--min-gap-ms", type=float, default=500.0, help="shortest gap (retrieval + pre-ranking)")
    p.add_argument("--zipf", type=float, default=1.2, help="user revisit skew")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=90.0, help="seconds of load per run")
    p.add_argument("--max-workers", type=int, default=32, help="client threads (open loop: in-flight requests)")
    p.add_argument("--read-timeout", type=float, default=120.0, help="nginx proxy_read_timeout (s)")
    p.add_argument("--ready-timeout", type=float, default=1800.0, help="max start-up time of a set (s)")
    p.add_argument("--run-dir", default=None, help="clusters' configs and logs (default: next to --out)")
    p.add_argument("--engine-factory", default=None, metavar="MODULE:CALLABLE",
                   help="build the instances' engines with this instead of RelayEngine (tests of the harness)")
    p.add_argument("--out", default="outputs/bench_cluster.json")
    p.set_defaults(func=cmd_bench_cluster)


def workload_for(args: argparse.Namespace, config: RelayGRConfig) -> Workload:
    if args.workload:
        return Workload.load(args.workload)
    model = config.model
    max_len = min(args.max_len, model.max_seq_len - (1 if model.user_feature_sizes else 0))
    spec = WorkloadSpec(num_users=args.users, num_requests=args.num_requests, qps=1.0,
                        median_len=min(args.median_len, max_len), max_len=max_len,
                        min_len=min(64, args.median_len, max_len),
                        gap_ms=args.gap_ms, min_gap_ms=args.min_gap_ms, num_candidates=args.candidates,
                        zipf_a=args.zipf, num_items=model.num_items, num_actions=model.num_actions, seed=args.seed)
    return Workload.generate(spec)


def cmd_bench_cluster(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.machine import machine_info
    from mindspore_relaygr.bench.model_bench import write_report

    config = load_config(args.config, args.override)
    slo_ms = args.slo_ms if args.slo_ms is not None else config.trigger.slo_ms
    workload = workload_for(args, config)
    check_workload(config, workload.spec)
    out = Path(args.out)
    bench = ClusterBenchSpec(config_path=str(Path(args.config).resolve()), overrides=tuple(args.override),
                             num_instances=args.instances, loads=tuple(args.loads), modes=tuple(args.modes),
                             order=args.order, slo_ms=slo_ms, profile=args.profile,
                             run_root=Path(args.run_dir or out.with_name(out.stem + "_run")).resolve(),
                             engine_factory=args.engine_factory, read_timeout_s=args.read_timeout,
                             ready_timeout_s=args.ready_timeout,
                             run=RunOptions(time_limit_s=args.time_limit, max_workers=args.max_workers))
    say = lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"workload: {len(workload.requests)} requests of {workload.spec.num_users} users, histories "
        f"{workload.spec.min_len}..{workload.spec.max_len} events (median {workload.spec.median_len}), "
        f"{workload.spec.num_candidates} candidates; loads {list(bench.loads)} QPS; modes {list(bench.modes)}")
    if not args.profile and not any(o.startswith("trigger.latency_profile=") for o in args.override):
        say("no --profile: every instance calibrates its latency model at start-up, at the same time as the "
            "others (slower, and they disturb each other's measurements); `relaygr profile` writes one")
    machine = machine_info()  # before the servers start: measured after they stop, the CPU is still busy
    from serving.cluster import sigterm_interrupts

    with sigterm_interrupts():  # SIGTERM stops the clusters, like Ctrl-C
        report = run_cluster_bench(bench, config, workload, say)
    report["workload"] = str(out.with_suffix(".workload.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    workload.save(out.with_suffix(".workload.json"))
    report["machine"] = machine
    write_report(report, out)
    save_config(load_config(args.config, set_overrides("relay", slo_ms, workload.spec.max_len, args.override,
                                                       args.profile)), out.with_suffix(".config.yaml"))
    plots.plot_cluster(report, out.with_suffix(".png"))
    print(format_table(report))
    print(f"[bench] wrote {out}, {out.with_suffix('.png')}, {out.with_suffix('.workload.json')} (replay it with "
          f"--workload) and {out.with_suffix('.config.yaml')}")
    return 0
