"""HTTP overhead of serving: `/v1/rank` end to end vs `RelayEngine.rank` in process, same requests.

    python -m serving.overhead --config configs/bench_long.yaml --prefix-len 1024 --suffix 32 --candidates 128

Starts one instance (`relaygr serve`, 127.0.0.1, stopped by PID at the end) and, meanwhile, builds the
same engine in this process. One user's prefix is pre-inferred on each side; then the same rank
request (prefix + suffix events, candidates) is timed `--repeats` times over HTTP (keep-alive,
client-side wall clock) and in process, in alternating rounds of `--round` requests so that the
machine's drift reaches both paths alike. Both paths serve from the device cache. Prints a table,
writes JSON; the target is HTTP/in-process <= 1.2 at prefix 1024.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.cli import positive_int
from mindspore_relaygr.config import RelayGRConfig, load_config
from mindspore_relaygr.shipped_configs import config_arg, config_help
from serving import headers

USER = "overhead-user"
FORCE_RELAY = ("trigger.risk_margin=0.000000001",)  # every pre-infer is "at risk": both sides serve from the cache


def _request(config: RelayGRConfig, prefix_len: int, suffix: int, num_candidates: int, seed: int = 0) -> dict:
    m = config.model
    n = prefix_len + suffix
    rng = np.random.default_rng(seed)
    hist = {"item_ids": rng.integers(1, m.num_items + 1, n).tolist(),
            "action_ids": rng.integers(0, m.num_actions, n).tolist(),
            "timestamps": (1_700_000_000 + np.cumsum(rng.integers(0, 3600, n))).tolist()}
    if m.user_feature_sizes:
        hist["user_features"] = [0] * len(m.user_feature_sizes)
    cands = rng.choice(np.arange(1, m.num_items + 1), size=num_candidates, replace=False).tolist()
    prefix = {k: (v if k == "user_features" else v[:prefix_len]) for k, v in hist.items()}
    return {"prefix": prefix, "history": hist, "candidates": cands}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(opener: Any, url: str, body: dict | None = None) -> tuple[int, dict, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          headers.AFFINITY: USER})
    try:
        with opener.open(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), dict(exc.headers)


def _summary(ms: list[float]) -> dict[str, float]:
    q = np.percentile(ms, [50, 90, 99])
    return {"mean": statistics.fmean(ms), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


class _HttpRanker:
    """The rank request over one kept-alive connection: `rank()` -> (end-to-end ms, server total ms, tier)."""

    def __init__(self, url: str, req: dict) -> None:
        import http.client

        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.body = json.dumps({"user_id": USER, "history": req["history"],
                                "candidates": {"item_ids": req["candidates"]}})
        self.headers = {"Content-Type": "application/json", headers.AFFINITY: USER}

    def rank(self) -> tuple[float, float, str]:
        t0 = time.perf_counter()
        self.conn.request("POST", "/v1/rank", body=self.body, headers=self.headers)
        resp = self.conn.getresponse()
        payload = json.loads(resp.read())
        e2e_ms = (time.perf_counter() - t0) * 1e3
        if resp.status != 200:
            raise RuntimeError(f"/v1/rank answered {resp.status}: {payload}")
        return e2e_ms, payload["timings_ms"]["total"], resp.getheader(headers.CACHE)

    def close(self) -> None:
        self.conn.close()


def _time_alternating(http_rank: Callable[[], tuple[float, float, str]],
                      local_rank: Callable[[], tuple[float, str]], repeats: int, round_len: int,
                      warmup: int = 3) -> dict[str, Any]:
    """`repeats` timings of each path, in alternating rounds of `round_len` (HTTP first), after `warmup` calls
    of each that are not kept."""
    for _ in range(warmup):
        http_rank()
        local_rank()
    e2e, server, local, http_tiers, local_tiers = [], [], [], set(), set()
    while len(e2e) < repeats:
        n = min(round_len, repeats - len(e2e))
        for _ in range(n):
            e, s, tier = http_rank()
            e2e.append(e)
            server.append(s)
            http_tiers.add(tier)
        for _ in range(n):
            ms, tier = local_rank()
            local.append(ms)
            local_tiers.add(tier)
    return {"e2e": e2e, "server": server, "local": local, "http_tiers": ",".join(sorted(http_tiers)),
            "local_tiers": sorted(local_tiers)}


def _wait_cached_http(opener: Any, url: str, prefix: dict) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status, body, _ = _http(opener, f"{url}/v1/preinfer", {"user_id": USER, "history": prefix})
        if status == 202 and body["reason"] == "already_cached":
            return
        if status != 202 or body["reason"] not in ("admitted", "inflight"):
            raise RuntimeError(f"pre-infer not admitted over HTTP: {status} {body} (raise trigger.slo_ms?)")
        time.sleep(0.05)
    raise RuntimeError("the prefill over HTTP did not finish")


def _wait_ready(opener: Any, url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the instance exited with {proc.returncode} during start-up")
        try:
            if _http(opener, f"{url}/readyz")[0] == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"instance not ready in {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> dict:
    from mindspore_relaygr.relay.engine import RelayEngine

    args.override = [*FORCE_RELAY, *args.override]
    config = load_config(args.config, args.override)
    req = _request(config, args.prefix_len, args.suffix, args.candidates)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(args.log, "ab")  # noqa: SIM115 - closed in finally
    cmd = [sys.executable, "-m", "serving.cli", "serve", "--config", str(args.config),
           "--port", str(port), "--instance-id", "overhead"]
    for o in args.override:
        cmd += ["-o", o]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        engine = RelayEngine.from_config(config, instance_id="in-process")  # warms up while the server does
        _wait_ready(opener, url, proc, args.ready_timeout)
        _wait_cached_http(opener, url, req["prefix"])
        decision = engine.preinfer(USER, req["prefix"])
        if not decision.admitted and decision.reason != "already_cached":
            raise RuntimeError(f"pre-infer not admitted in process: {decision}")
        engine.wait_prefills(600)

        def local_rank() -> tuple[float, str]:
            t0 = time.perf_counter()
            result = engine.rank(USER, req["history"], req["candidates"])
            return (time.perf_counter() - t0) * 1e3, result.cache

        ranker = _HttpRanker(url, req)
        try:
            timed = _time_alternating(ranker.rank, local_rank, args.repeats, args.round)
        finally:
            ranker.close()
            engine.close()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
    report = {"config": str(args.config), "overrides": args.override, "prefix_len": args.prefix_len,
              "suffix": args.suffix, "candidates": args.candidates, "repeats": args.repeats, "round": args.round,
              "http_e2e_ms": _summary(timed["e2e"]), "http_server_total_ms": _summary(timed["server"]),
              "in_process_ms": _summary(timed["local"]), "http_tiers": timed["http_tiers"],
              "in_process_tiers": timed["local_tiers"]}
    report["ratio_p50"] = report["http_e2e_ms"]["p50"] / report["in_process_ms"]["p50"]
    report["ratio_mean"] = report["http_e2e_ms"]["mean"] / report["in_process_ms"]["mean"]
    return report


def format_table(report: dict) -> str:
    rows = [("HTTP /v1/rank end to end", report["http_e2e_ms"]),
            ("  engine time inside the server", report["http_server_total_ms"]),
            ("RelayEngine.rank in process", report["in_process_ms"])]
    lines = [f"prefix {report['prefix_len']}, suffix {report['suffix']}, {report['candidates']} candidates, "
             f"{report['repeats']} repeats (tiers: HTTP {report['http_tiers']}, in process "
             f"{','.join(report['in_process_tiers'])})",
             f"{'path':34} {'mean':>8} {'p50':>8} {'p90':>8} {'p99':>8}  (ms)"]
    lines += [f"{name:34} {s['mean']:8.2f} {s['p50']:8.2f} {s['p90']:8.2f} {s['p99']:8.2f}" for name, s in rows]
    lines.append(f"overhead HTTP / in process: p50 {report['ratio_p50']:.3f}x, mean {report['ratio_mean']:.3f}x "
                 "(target <= 1.2x at prefix 1024)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=config_arg, default="bench_long", help=config_help())
    parser.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix", type=int, default=32)
    parser.add_argument("--candidates", type=int, default=128)
    parser.add_argument("--repeats", type=positive_int, default=1000, help="timed ranks per path")
    parser.add_argument("--round", type=positive_int, default=20,
                        help="ranks per path before switching to the other (alternating rounds)")
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--log", default="outputs/serving_overhead.server.log")
    parser.add_argument("--out", default="outputs/serving_overhead.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("GLOG_v", "3")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.log).parent.mkdir(parents=True, exist_ok=True)
    report = run(args)
    print(format_table(report))
    from mindspore_relaygr.bench.model_bench import write_report

    write_report(report, Path(args.out))  # with the machine it ran on
    print(f"[overhead] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
