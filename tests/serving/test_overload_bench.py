"""`relaygr bench overload`: the per-point summary and the routing of a user subset (fast), and the
whole harness on fake engines with a fixed service time behind real nginx (slow; counts, no timing)."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from mindspore_relaygr.bench.loadgen import Outcome
from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import overload_bench
from serving.headers import encode_affinity
from serving.http_target import user_id
from serving.overload_bench import OverloadSpec, point_summary, rank_workload, users_routed_to
from tests.conftest import CONFIGS
from tests.serving.servers import FAKE_FACTORY
from tests.waiting import wait_until

TINY = CONFIGS / "tiny.yaml"


def outcome(at_s: float, ms: float, status: int, error: str = "", tier: str = "miss") -> Outcome:
    return Outcome("rank", 0, at_s, ms, status == 200, tier if status == 200 else f"http_{status}", False,
                   status, error)


def test_point_summary_counts_goodput_within_the_slo_and_keeps_503s_apart():
    outs = [outcome(0.0, 10.0, 200), outcome(0.5, 60.0, 200, tier="device"), outcome(1.0, 2.0, 503),
            outcome(1.5, 3.0, 503), outcome(2.0, 5.0, 599, "ConnectionError: x")]
    row = point_summary(outs, offered_rps=2.5, slo_ms=50.0)
    counts = (row["ranks"], row["accepted"], row["within_slo"], row["rejected_503"], row["other_errors"])
    assert counts == (5, 2, 1, 2, 1)
    assert row["goodput_rps"] == pytest.approx(1 / 2.0)  # one good rank over the 2 s of arrivals
    assert row["reject_p50_ms"] == pytest.approx(2.5) and row["accepted_max_ms"] == 60.0
    assert row["error_samples"] == ["ConnectionError: x"]
    assert row["accepted_tiers"] == {"device": 1, "miss": 1}  # what the answered ranks were served from


def test_users_routed_to_keeps_exactly_the_requests_nginx_hashes_to_that_server():
    workload = rank_workload(load_config(TINY), 300, 50, 40, 8, seed=0)
    ring = NginxConsistentHash(["127.0.0.1:9001", "127.0.0.1:9002"])
    routed = users_routed_to(workload, ring, "127.0.0.1:9001")
    assert 0 < len(routed.requests) < len(workload.requests)
    assert all(ring.route(encode_affinity(user_id(r.user))) == "127.0.0.1:9001" for r in routed.requests)
    assert [r.at_s for r in routed.requests] == sorted(r.at_s for r in routed.requests)


def test_bad_specs_are_refused(tmp_path):
    for bad in ({"ranks": 1}, {"forwarded_ranks": 0}, {"multiples": ()}, {"multiples": (0.0, 1.0)}, {"saturate": 0.0}):
        with pytest.raises(ConfigError):
            OverloadSpec(config_path=str(TINY), run_dir=tmp_path, **bad)


@pytest.mark.slow
def test_harness_on_fake_engines_sheds_past_capacity_and_nginx_forwards(tmp_path, monkeypatch):
    """Fake engines serve one rank per 20 ms: past ~50 ranks/s admission must refuse (503), never fail,
    and ranks of i0's users sent through nginx while i0 is saturated must all be answered."""
    monkeypatch.setenv("RELAYGR_FAKE_RANK_MS", "20")
    out = tmp_path / "overload.json"
    parser = argparse.ArgumentParser(prog="relaygr bench")
    overload_bench.register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["overload", "--config", str(TINY), "--engine-factory", FAKE_FACTORY,
                              "-o", "trigger.slo_ms=200",  # a budget of 140 ms: about 7 ranks at once
                              "--multiples", "0.5", "3", "--ranks", "150", "--calibrate-s", "2",
                              "--forwarded-ranks", "60",
                              "--median-len", "40", "--candidates", "8", "--pin-cpus", "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file() and out.with_suffix(".config.yaml").is_file()
    cores = sorted(os.sched_getaffinity(0))
    assert report["pin_cpus"] and report["cpu_sets"] == {"i0": [cores[0]], "i1": [cores[1 % len(cores)]]}
    low, high = report["single"]
    sat = report["saturation"]
    assert sat["ok"] > 0 and sat["other"] == 0
    # capacity is read from i0's own count: it served what the client saw answered, in at most the run's time,
    # and the loads are multiples of it
    assert sat["served"] == sat["ok"] and 0 < sat["busy_s"] <= sat["seconds"]
    assert sat["capacity_rps"] == pytest.approx(sat["served"] / sat["busy_s"]) and sat["capacity_rps"] >= sat["rps"]
    assert [r["offered_rps"] for r in report["single"]] == pytest.approx([0.5 * sat["capacity_rps"],
                                                                          3 * sat["capacity_rps"]])
    assert low["other_errors"] == high["other_errors"] == 0
    assert low["ranks"] == high["ranks"] == 150
    assert high["rejected_503"] > 0 and high["accepted"] > 0
    fwd = report["forwarding"]
    assert fwd["via_nginx_failed"] == 0 and 30 <= fwd["via_nginx"]["ranks"] <= 120  # about --forwarded-ranks
    assert fwd["direct"]["rejected_503"] > 0
    assert fwd["via_nginx_instances"].get("i1", 0) > 0  # what i0 refused, nginx served from i1
    # Each instance's admission counters over the run: i1 admitted exactly the ranks it answered, and i0
    # refused at least the direct ranks answered 503 (plus the forwarded ones that then went to i1).
    assert fwd["admission"]["i1"]["admitted"] == fwd["via_nginx_instances"]["i1"]
    assert fwd["admission"]["i0"]["rejected"] >= fwd["direct"]["rejected_503"]


@pytest.mark.slow
def test_sigterm_stops_the_bench_s_nginx_and_instances(tmp_path):
    """A stopped `relaygr bench overload` (SIGTERM, as `timeout` or a job runner sends) leaves nothing running."""
    import signal
    import subprocess
    import sys

    from serving.cluster import _alive, read_state, stop_members
    from tests.conftest import REPO
    from tests.serving.servers import stop_group, tail

    out = tmp_path / "overload.json"
    run_dir = tmp_path / "overload_run"
    log = tmp_path / "bench.log"
    cmd = [sys.executable, "-m", "serving.cli", "bench", "overload", "--config", str(TINY),
           "--engine-factory", FAKE_FACTORY, "--ranks", "5000", "--calibrate-s", "2", "--median-len", "40",
           "--candidates", "8", "--out", str(out)]
    with open(log, "ab") as sink:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "RELAYGR_FAKE_RANK_MS": "20",
                                     "PATH": os.environ.get("PATH", "") + ":/usr/sbin"},
                                start_new_session=True)
    try:
        def saturating() -> bool:  # nginx and both instances are up
            assert proc.poll() is None, tail(log)
            return "saturating throughput" in log.read_text(errors="replace")

        wait_until(saturating, 600, "the bench to start saturating", poll_s=0.2)
        members = read_state(run_dir)
        assert {m.name for m in members} >= {"i0", "i1"} and all(_alive(m.pid) for m in members)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert not [m.name for m in members if _alive(m.pid)], tail(log)
        assert not out.exists()  # stopped before it finished: no report
    finally:
        if proc.poll() is None:
            stop_group(proc)
        if (run_dir / "cluster.json").exists():
            stop_members(read_state(run_dir), run_dir.resolve(), 20)
