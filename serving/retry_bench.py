"""`relaygr bench retry`: one instance under clients that resend a refused rank at once (like wrk).

N closed-loop connections (kept alive, `serving.http_target`), each sending ranks back to back; a rank
answered 503 is sent again at once, without waiting out Retry-After, until it is served, the run ends
or it fails otherwise. Each connection count runs for `--seconds` after a short warm-up at the first
count. Per count: goodput (200s per second), P50/P99 of the 200s (the served attempt) and from a
rank's first attempt to its 200, refusals per second and their median latency, other errors, and the
instance's own admission view (learned unit cost, admitted, refused) from `/v1/stats`. Ranks only
(full inference, the heaviest request). Client and instance share this machine's cores: the client's
threads are part of the load. Everything binds 127.0.0.1; the instance is stopped in a `finally`.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mindspore_relaygr.bench.loadgen import percentile
from mindspore_relaygr.bench.workload import Request, Workload
from mindspore_relaygr.config import load_config, save_config
from mindspore_relaygr.errors import ConfigError
from serving.cluster_bench import HOST, add_instance_config_args, free_port_block
from serving.http_target import HTTPTarget
from serving.overload_bench import admission_view, rank_workload

DEFAULT_CONNECTIONS = (2, 8, 64)
WARMUP_S = 3.0  # at the first connection count, before any measurement: the unit cost is learned


@dataclass
class ConnectionLog:
    """What one connection saw: latency of every attempt by outcome, and how its refusals were handled."""

    ok_ms: list[float] = field(default_factory=list)
    first_try_to_ok_ms: list[float] = field(default_factory=list)
    refused_ms: list[float] = field(default_factory=list)
    resent: int = 0  # refusals followed at once by the same rank again
    cut_off: int = 0  # refusals at the end of the run (not resent)
    errors: list[str] = field(default_factory=list)


def run_connection(send: Callable[[Request], int], requests_: list[Request], offset: int, stride: int,
                   done: Callable[[], bool]) -> ConnectionLog:
    """Send ranks offset, offset + stride, ... until `done()`, resending each refused one at once."""
    log = ConnectionLog()
    i = offset
    while not done():
        req = requests_[i % len(requests_)]
        first = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            try:
                status = send(req)
            except Exception as exc:  # noqa: BLE001 - a connection error or timeout is recorded, not raised
                log.errors.append(f"{type(exc).__name__}: {exc}")
                break
            now = time.perf_counter()
            if status == 200:
                log.ok_ms.append((now - t0) * 1e3)
                log.first_try_to_ok_ms.append((now - first) * 1e3)
                break
            if status != 503:
                log.errors.append(f"HTTP {status}")
                break
            log.refused_ms.append((now - t0) * 1e3)
            if done():
                log.cut_off += 1
                break
            log.resent += 1  # no Retry-After wait: the same rank again, now
        i += stride
    return log


def measure(url: str, workload: Workload, connections: int, seconds: float) -> dict[str, Any]:
    """One closed-loop run of `connections` immediate-retry connections for `seconds`."""
    target = HTTPTarget(url, workload)
    target.prepare(workload.requests)
    before = admission_view(url)
    logs: list[ConnectionLog | None] = [None] * connections
    stop_at = time.perf_counter() + seconds

    def run(k: int) -> None:
        logs[k] = run_connection(lambda req: target.rank(req)[2], workload.requests, k, connections,
                                 lambda: time.perf_counter() >= stop_at)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(k,), name=f"retry-{k}") for k in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    target.close()
    after = admission_view(url)
    return summarize([log for log in logs if log is not None], connections, elapsed, before, after)


def summarize(logs: list[ConnectionLog], connections: int, elapsed_s: float, before: dict[str, Any],
              after: dict[str, Any]) -> dict[str, Any]:
    """The report row of one connection count."""
    ok = [ms for log in logs for ms in log.ok_ms]
    e2e = [ms for log in logs for ms in log.first_try_to_ok_ms]
    refused = [ms for log in logs for ms in log.refused_ms]
    errors = [e for log in logs for e in log.errors]

    def delta(key: str) -> int | None:
        return after[key] - before.get(key, 0) if key in after else None

    def pct(values: list[float], q: float) -> float | None:
        return percentile(values, q) if values else None

    return {
        "connections": connections, "seconds": elapsed_s,
        "ok": len(ok), "goodput_rps": len(ok) / elapsed_s,
        "ok_p50_ms": pct(ok, 50), "ok_p99_ms": pct(ok, 99),
        "first_try_to_ok_p50_ms": pct(e2e, 50), "first_try_to_ok_p99_ms": pct(e2e, 99),
        "refused": len(refused), "refusals_per_s": len(refused) / elapsed_s, "refusal_p50_ms": pct(refused, 50),
        "refusal_p99_ms": pct(refused, 99),
        "resent_at_once": sum(log.resent for log in logs), "refusals_cut_off": sum(log.cut_off for log in logs),
        "other_errors": len(errors), "error_samples": sorted(set(errors))[:3],
        "server": {"admitted": delta("admitted"), "rejected": delta("rejected"), "served": delta("served"),
                   "cost_ms": after.get("cost_ms"), "budget_ms": after.get("budget_ms")},
    }


@dataclass(frozen=True)
class RetrySpec:
    """What `relaygr bench retry` runs."""

    config_path: str
    run_dir: Path
    overrides: tuple[str, ...] = ()
    connections: tuple[int, ...] = DEFAULT_CONNECTIONS
    seconds: float = 20.0
    warmup_s: float = WARMUP_S
    median_len: int = 96
    num_candidates: int = 32
    engine_factory: str | None = None  # tests of the harness: a fake engine instead of RelayEngine

    def __post_init__(self) -> None:
        if not self.connections or min(self.connections) < 1 or self.seconds <= 0 or self.warmup_s < 0:
            raise ConfigError("connections must be >= 1, seconds > 0 and warmup_s >= 0")


def run_retry_bench(bench: RetrySpec, say: Callable[[str], None]) -> dict[str, Any]:
    """Start one instance, measure every connection count, stop it."""
    from serving.cluster import Cluster, ClusterSpec

    config = load_config(bench.config_path, list(bench.overrides))
    workload = rank_workload(config, 2000, 200, bench.median_len, bench.num_candidates, seed=0)
    spec = ClusterSpec(port=free_port_block(2), num_instances=1, run_dir=bench.run_dir,
                       config_path=bench.config_path, overrides=bench.overrides, host=HOST,
                       max_conns=config.serving.threads, engine_factory=bench.engine_factory)
    cluster = Cluster(spec)
    report: dict[str, Any] = {"config": bench.config_path, "overrides": list(bench.overrides),
                              "slo_ms": config.trigger.slo_ms, "admission_fraction": config.relay.admission_fraction,
                              "threads": config.serving.threads, "parse_slots": config.serving.parse_slots,
                              "parse_wait_ms": config.serving.parse_wait_ms, "seconds": bench.seconds,
                              "spec": asdict(workload.spec), "rows": []}
    try:
        say(f"starting one instance (logs in {bench.run_dir / 'logs'})")
        cluster.start(1800.0)
        url = f"http://{HOST}:{spec.instance_ports[0]}"
        if bench.warmup_s > 0:
            measure(url, workload, bench.connections[0], bench.warmup_s)
        for n in bench.connections:
            row = measure(url, workload, n, bench.seconds)
            report["rows"].append(row)
            say(row_line(row))
    finally:
        cluster.stop()
    return report


def row_line(r: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"
    cost = r["server"]["cost_ms"]
    return (f"{r['connections']:>5} | {r['goodput_rps']:>7.1f}/s ({r['ok']:>6}) | p50 {ms(r['ok_p50_ms']):>6} "
            f"p99 {ms(r['ok_p99_ms']):>6} ms | first try->200 p99 {ms(r['first_try_to_ok_p99_ms']):>7} ms | "
            f"503 {r['refusals_per_s']:>7.1f}/s p50 {ms(r['refusal_p50_ms']):>5} ms | other {r['other_errors']} | "
            f"cost {'-' if cost is None else f'{cost:.2f}'} ms")


def format_report(report: dict[str, Any]) -> str:
    lines = [f"one instance, SLO {report['slo_ms']:g} ms, admission fraction {report['admission_fraction']}, "
             f"{report['threads']} threads, {report['parse_slots']} parse slots; clients resend a 503 at once",
             f"{'conns':>5} | {'goodput (200s)':>17} | 200s, ms | from first try | refusals | other | unit cost"]
    lines += [row_line(r) for r in report["rows"]]
    return "\n".join(lines)


def register(bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `relaygr bench retry` to the `relaygr bench` subcommands."""
    p = bench_subparsers.add_parser("retry", help="goodput, latency and refusals of one instance under clients that "
                                                  "resend a refused rank at once (wrk-like), per connection count")
    add_instance_config_args(p, "tiny")
    p.add_argument("--connections", type=int, nargs="+", default=list(DEFAULT_CONNECTIONS),
                   help="closed-loop connections, one run each")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each run (s)")
    p.add_argument("--warmup-s", type=float, default=WARMUP_S, help="warm-up at the first count, not reported (s)")
    p.add_argument("--median-len", type=int, default=96, help="median history length of the ranks")
    p.add_argument("--candidates", type=int, default=32)
    p.add_argument("--engine-factory", default=None, metavar="MODULE:CALLABLE",
                   help="build the instance's engine with this instead of RelayEngine (tests of the harness)")
    p.add_argument("--out", default="outputs/bench_retry.json")
    p.set_defaults(func=cmd_bench_retry)


def cmd_bench_retry(args: argparse.Namespace) -> int:
    from mindspore_relaygr.bench import plots
    from mindspore_relaygr.bench.machine import machine_info
    from mindspore_relaygr.bench.model_bench import write_report
    from serving.cluster import sigterm_interrupts

    out = Path(args.out)
    say = lambda msg: print(f"[retry] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    bench = RetrySpec(config_path=str(Path(args.config).resolve()), run_dir=out.with_name(out.stem + "_run").resolve(),
                      overrides=tuple(args.override), connections=tuple(args.connections), seconds=args.seconds,
                      warmup_s=args.warmup_s, median_len=args.median_len, num_candidates=args.candidates,
                      engine_factory=args.engine_factory)
    machine = machine_info()  # before the instance starts
    with sigterm_interrupts():  # SIGTERM stops the instance, like Ctrl-C
        report = run_retry_bench(bench, say)
    report["machine"] = machine
    write_report(report, out)
    save_config(load_config(bench.config_path, list(bench.overrides)), out.with_suffix(".config.yaml"))
    plots.plot_retry(report, out.with_suffix(".png"))
    print(format_report(report))
    print(f"[retry] wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.config.yaml')}")
    return 0
