"""`relaygr bench cluster`: the run plan, workload scaling and counter bookkeeping (fast), and one
end-to-end run on real tiny-config instances behind nginx (slow; counts only, no timing asserts)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError
from serving import cluster_bench
from serving.cluster_bench import (
    MODES,
    ClusterBenchSpec,
    at_load,
    check_workload,
    diff_counters,
    plan_runs,
    set_overrides,
)
from tests.conftest import CONFIGS, ONE_BUCKET, cli_overrides
from tests.serving.servers import FAKE_FACTORY

TINY = CONFIGS / "tiny.yaml"


def parse(argv: list[str]) -> argparse.Namespace:
    """`relaygr bench ...` as the lead's cli.py wires it: a `bench` subparser filled by `register`."""
    parser = argparse.ArgumentParser(prog="relaygr bench")
    cluster_bench.register(parser.add_subparsers(dest="bench", required=True))
    return parser.parse_args(argv)


def test_plan_reverses_the_mode_order_per_load_and_grouped_runs_one_set_at_a_time():
    modes = list(MODES)
    runs = plan_runs([1.0, 2.0, 3.0], modes, "interleaved")
    assert runs == [(1.0, "baseline"), (1.0, "relay"), (1.0, "relay_no_affinity"),
                    (2.0, "relay_no_affinity"), (2.0, "relay"), (2.0, "baseline"),
                    (3.0, "baseline"), (3.0, "relay"), (3.0, "relay_no_affinity")]
    grouped = plan_runs([1.0, 2.0, 3.0], modes, "grouped")
    assert sorted(grouped) == sorted(runs)
    assert grouped[:3] == [(1.0, "baseline"), (2.0, "baseline"), (3.0, "baseline")]  # then the relay set's runs
    assert [m for _, m in grouped[3:]] == ["relay", "relay_no_affinity", "relay_no_affinity", "relay", "relay",
                                           "relay_no_affinity"]
    assert plan_runs([1.0, 2.0], ["relay"], "interleaved") == [(1.0, "relay"), (2.0, "relay")]


def test_every_load_replays_the_same_requests_scaled_in_time():
    base = Workload.generate(WorkloadSpec(num_users=20, num_requests=30, qps=1.0, median_len=50, max_len=100,
                                          min_len=10, num_candidates=8, num_items=200, num_actions=4))
    fast = at_load(base, 4.0)
    assert fast.spec == replace(base.spec, qps=4.0) and fast.base_lens == base.base_lens
    for a, b in zip(base.requests, fast.requests, strict=True):
        assert b.at_s == pytest.approx(a.at_s / 4.0)
        assert (b.user, b.visit, b.gap_s, b.candidate_seed) == (a.user, a.visit, a.gap_s, a.candidate_seed)
        assert (fast.candidates(b) == base.candidates(a)).all()
        assert all((fast.history(b)[k] == v).all() for k, v in base.history(a).items())
    assert at_load(fast, 1.0).requests[-1].at_s == pytest.approx(base.requests[-1].at_s)


def test_set_overrides_make_the_baseline_full_inference_and_keep_the_users_overrides():
    relay = set_overrides("relay", 120.0, 1536, ["cache.num_slots=4"], None)
    assert relay == ["trigger.slo_ms=120.0", "relay.admission_fraction=null", "cache.num_slots=4"]
    base = set_overrides("baseline", 120.0, 1536, ["relay.enabled=true"], "p.json")
    assert base[0] == "trigger.slo_ms=120.0" and base[-2:] == ["relay.enabled=false", "relay.max_online_len=1536"]
    assert any(o.startswith("trigger.latency_profile=/") and o.endswith("/p.json") for o in base)
    cfg = load_config(TINY, set_overrides("baseline", 80.0, 100, [], None))
    assert (cfg.relay.enabled, cfg.relay.max_online_len, cfg.trigger.slo_ms) == (False, 100, 80.0)
    assert cfg.relay.admission_fraction is None  # the benchmark measures queueing: nothing is refused
    on = load_config(TINY, set_overrides("relay", 80.0, 100, ["relay.admission_fraction=0.5"], None))
    assert on.relay.admission_fraction == 0.5  # unless the user asks for it


def test_counters_are_diffed_per_instance():
    before = {"i0": {"rank_miss": 3, "prefills": 1}, "i1": {}}
    after = {"i0": {"rank_miss": 5, "prefills": 1, "wasted_prefills": 2}, "i1": {"rank_device": 4}}
    assert diff_counters(before, after) == {"i0": {"rank_miss": 2, "wasted_prefills": 2}, "i1": {"rank_device": 4}}


def test_bad_specs_and_workloads_are_rejected_before_anything_starts():
    cfg = load_config(TINY)
    ok = WorkloadSpec(num_users=4, num_requests=4, median_len=50, max_len=127, min_len=10, num_candidates=8,
                      num_items=200, num_actions=4)
    check_workload(cfg, ok)
    for bad, match in ((replace(ok, max_len=128), "max_len=128"), (replace(ok, num_items=201), "num_items"),
                       (replace(ok, num_candidates=33), "num_candidates")):
        with pytest.raises(ConfigError, match=match):
            check_workload(cfg, bad)
    for kwargs, match in (({"modes": ("relay", "nope")}, "modes"), ({"modes": ()}, "modes"),
                          ({"order": "zigzag"}, "order"), ({"loads": (0.0,)}, "loads")):
        with pytest.raises(ConfigError, match=match):
            ClusterBenchSpec(config_path=str(TINY), **kwargs)
    args = parse(["cluster"])
    assert (args.instances, args.modes, args.order, args.out) == (2, list(MODES), "interleaved",
                                                                  "outputs/bench_cluster.json")
    assert args.config.endswith("configs/bench_long.yaml")


@pytest.fixture(scope="module")
def fixed_profile(tmp_path_factory):
    """A fixed latency profile: the instances skip calibration (graphs compile on first use)."""
    from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

    path = tmp_path_factory.mktemp("profile") / "latency.json"
    LatencyModel([LatencyPoint("full", 128, 32, 0, 50.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                  LatencyPoint("prefill", 128, 0, 0, 20.0)]).to_json(path)
    return path


@pytest.mark.slow
def test_bench_cluster_end_to_end_on_tiny(tmp_path, fixed_profile, capsys):
    out = tmp_path / "cluster.json"
    num_requests, loads = 6, [3.0, 6.0]
    fast_start = ["-o", "relay.warmup=false", "-o", "context.num_threads=1", *cli_overrides(ONE_BUCKET)]
    # Every pre-infer is "at risk" on the fast tiny model, and a rank waits for its running prefill.
    relay = ["-o", "trigger.risk_margin=0.000000001", "-o", "relay.inflight_wait_ms=10000"]
    args = parse(["cluster", "--config", str(TINY), *fast_start, *relay, "--instances", "2",
                  "--loads", *map(str, loads), "--num-requests", str(num_requests), "--users", "4",
                  "--median-len", "60", "--max-len", "127", "--candidates", "8",
                  "--gap-ms", "100", "--min-gap-ms", "50",
                  "--time-limit", "30", "--profile", str(fixed_profile), "--ready-timeout", "240", "--out", str(out)])
    assert args.func(args) == 0

    report = json.loads(out.read_text())
    assert report["modes"] == list(MODES) and report["num_instances"] == 2
    assert sorted((r["offered_qps"], r["mode"]) for r in report["results"]) == sorted(
        (q, m) for q in loads for m in MODES)
    assert set(report["startup_s"]) == {"baseline", "relay"} and all(s > 0 for s in report["startup_s"].values())
    assert report["overrides"]["baseline"][-2:] == ["relay.enabled=false", "relay.max_online_len=127"]
    for r in report["results"]:
        relayed = r["mode"] != "baseline"
        assert r["ranks"] == num_requests and r["errors"] == 0 and r["rejected_503"] == 0, r["error_samples"]
        assert sum(r["tiers"].values()) == num_requests
        assert sum(v["ranks"] for v in r["per_instance"].values()) == num_requests  # the instances' counters
        assert set(r["per_instance"]) <= {"i0", "i1"}
        assert sum(r["client_instances"]["rank"].values()) == num_requests
        assert r["preinfers"] == (num_requests if relayed else 0)
        assert sum(r["engine_trigger"].values()) == r["preinfers"] == sum(r["trigger"].values())
        assert r["wasted_prefills"] == r["engine"].get("wasted_prefills", 0) >= 0
        assert 0.0 <= r["hit_rate"] <= 1.0 and r["p50_ms"] <= r["p99_ms"] <= r["max_ms"]
        if relayed:
            assert "bypass" not in r["tiers"] and r["colocated"] is not None
        else:
            assert set(r["tiers"]) == {"bypass"} and r["truncations"] == 0 and r["colocated"] is None
        if r["mode"] == "relay":
            assert r["colocated"] == 1.0  # affinity: every rank met its pre-infer's instance
    assert set(report["compliant_qps"]) == set(MODES)
    for suffix in (".png", ".workload.json", ".config.yaml"):
        assert out.with_suffix(suffix).is_file()
    assert Workload.load(out.with_suffix(".workload.json")).spec.num_requests == num_requests
    table = capsys.readouterr().out
    assert "relay_no_affinity" in table and "SLO-compliant QPS" in table
    assert not any((tmp_path / "cluster_run" / s / "cluster.json").exists() for s in ("baseline", "relay"))


@pytest.mark.slow
def test_harness_on_fake_engines_replays_a_saved_workload_one_set_at_a_time(tmp_path):
    """The harness alone (numpy FakeEngine instances, seconds): --workload, --order grouped, a mode
    subset, and nginx switching from affinity to random between the relay modes."""
    saved = Workload.generate(WorkloadSpec(num_users=8, num_requests=24, qps=1.0, median_len=60, max_len=127,
                                           min_len=10, gap_ms=20.0, num_candidates=8, num_items=200, num_actions=4))
    saved.save(tmp_path / "saved.json")
    out = tmp_path / "fake.json"
    args = parse(["cluster", "--config", str(TINY), "--engine-factory", FAKE_FACTORY,
                  "--workload", str(tmp_path / "saved.json"), "--loads", "40", "--order", "grouped",
                  "--modes", "relay_no_affinity", "baseline", "relay", "--time-limit", "20", "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert report["spec"] == json.loads((tmp_path / "saved.json").read_text())["spec"]
    by_mode = {r["mode"]: r for r in report["results"]}
    assert [r["mode"] for r in report["results"]] == ["baseline", "relay_no_affinity", "relay"]  # grouped
    assert all(r["ranks"] == 24 and r["errors"] == 0 for r in report["results"])
    assert by_mode["relay"]["balance"] == "affinity" and by_mode["relay"]["colocated"] == 1.0
    assert by_mode["relay_no_affinity"]["balance"] == "random"
    # Random balancing: pre-infers and ranks of one request part ways (all 24 together: p = 2^-24).
    assert by_mode["relay_no_affinity"]["colocated"] < 1.0
    assert set(by_mode["relay_no_affinity"]["client_instances"]["rank"]) == {"i0", "i1"}
    assert set(by_mode["baseline"]["tiers"]) == {"bypass"}
