"""`relaygr bench revisit`: the revisit-fraction measure, its knobs, and an end-to-end run on the tiny config."""

from __future__ import annotations

import argparse
import json

import pytest

from mindspore_relaygr.bench.revisit import TIER_ORDER, _spec, cmd_bench_revisit, register, tier_shares, trim
from mindspore_relaygr.bench.workload import Request, Workload, WorkloadSpec
from mindspore_relaygr.config import load_config
from tests.conftest import CONFIGS


def _workload(users: list[int], spacing_s: float = 1.0) -> Workload:
    requests = [Request(at_s=i * spacing_s, user=u, visit=0, gap_s=0.0, candidate_seed=i) for i, u in enumerate(users)]
    return Workload(
        WorkloadSpec(num_users=max(users, default=0) + 1),
        [64] * (max(users, default=0) + 1),
        requests,
        [0] * (max(users, default=0) + 1),
    )


@pytest.mark.parametrize(
    ("users", "expected"),
    [
        ([], 0.0),
        ([3], 0.0),
        ([0, 1, 2, 3], 0.0),
        ([5, 5, 5, 5], 0.75),
        ([1, 2, 1, 3, 1, 2], 0.5),  # the 3rd, 5th and 6th requests revisit
        ([7, 8, 8, 9, 10], 0.2),
    ],
)
def test_revisit_fraction_on_hand_made_workloads(users, expected):
    assert _workload(users).revisit_fraction() == pytest.approx(expected, abs=1e-12)


def test_revisit_fraction_counts_the_visits_of_a_generated_workload():
    w = Workload.generate(WorkloadSpec(num_users=50, num_requests=300, zipf_a=1.1, seed=5))
    assert w.revisit_fraction() == pytest.approx(sum(r.visit > 0 for r in w.requests) / 300)


def test_trim_keeps_the_early_arrivals_and_measures_only_them():
    w = _workload([1, 2, 1, 3, 1, 2])  # arrivals at 0, 1, ..., 5 s
    head = trim(w, 2.5)
    assert [r.user for r in head.requests] == [1, 2, 1]
    assert head.revisit_fraction() == pytest.approx(1 / 3)
    assert head.base_lens == w.base_lens and head.max_visits == w.max_visits  # histories unchanged
    assert trim(w, None) is w


def _measured(**kw) -> float:
    """Mean revisit fraction over three seeds (one generated workload of 2000 requests each)."""
    spec = WorkloadSpec(num_requests=2000, **kw)
    return sum(Workload.generate(WorkloadSpec(**{**spec.__dict__, "seed": s})).revisit_fraction() for s in range(3)) / 3


def test_revisit_fraction_grows_with_zipf_exponent():
    fractions = [_measured(num_users=5000, zipf_a=a) for a in (0.0, 0.6, 1.0, 1.4, 2.0)]
    assert fractions == sorted(fractions) and len(set(fractions)) == len(fractions), fractions
    assert fractions[0] < 0.25 and fractions[-1] > 0.85, fractions


def test_revisit_fraction_falls_with_user_count():
    fractions = [_measured(num_users=n, zipf_a=0.0) for n in (100, 500, 2000, 10000)]
    assert fractions == sorted(fractions, reverse=True) and len(set(fractions)) == len(fractions), fractions
    # Uniform popularity: expected distinct users = n * (1 - (1 - 1/n)^N) for N requests.
    expected = 1 - 100 * (1 - (1 - 1 / 100) ** 2000) / 2000
    assert fractions[0] == pytest.approx(expected, abs=0.01)


def test_tier_shares_cover_every_tier_and_sum_to_one():
    shares = tier_shares({"device": 3, "dram": 1, "miss": 4, "bypass": 2})
    assert list(shares) == [*TIER_ORDER, "bypass"]
    assert shares["device"] == 0.3 and shares["partial"] == 0.0 and shares["bypass"] == 0.2
    assert sum(shares.values()) == pytest.approx(1.0)
    assert set(tier_shares({}).values()) == {0.0}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="bench"))
    return parser


def test_parser_points_and_workload_spec_fit_the_model():
    args = _parser().parse_args(["revisit", "--points", "0.5", "1.5", "--max-len", "9999", "--median-len", "500"])
    assert args.func is cmd_bench_revisit and args.zipf == [0.5, 1.5] and not args.no_expander_too
    assert not args.no_extension_too
    assert args.out == "outputs/bench_revisit.json" and args.config.endswith("bench_long.yaml")
    spec = _spec(args, load_config(CONFIGS / "tiny.yaml", []))
    # tiny: 128 tokens per sequence and per slot, one of them the user token.
    assert (spec.max_len, spec.median_len, spec.min_len) == (127, 127, 64)
    assert (spec.num_users, spec.num_requests, spec.qps, spec.growth_per_visit) == (1000, 100, 1.0, 0)


@pytest.mark.slow
def test_bench_revisit_end_to_end_on_tiny(tmp_path):
    parser = _parser()
    out = tmp_path / "revisit.json"
    zipfs = [0.0, 2.0]
    args = parser.parse_args([
        "revisit", "--config", str(CONFIGS / "tiny.yaml"),
        # One bucket per axis (3 graphs to warm up); everything at risk; 2 device slots for 6 users.
        # Chunks of 32 events: an extension by 10 new events (more than the 8-event suffix) runs one
        # chunk where a fresh prefill runs two to four.
        "-o", "model.len_buckets=[32, 128]", "-o", "model.suffix_buckets=[8]", "-o", "model.candidate_buckets=[32]",
        "-o", "trigger.slo_ms=1", "-o", "relay.max_online_len=32", "-o", "cache.num_slots=2",
        "-o", "trigger.prefill_chunk_len=32",
        "--qps", "20", "--zipf", *map(str, zipfs), "--users", "6", "--num-requests", "16", "--median-len", "30",
        "--max-len", "40", "--candidates", "16", "--gap-ms", "20", "--min-gap-ms", "5",
        "--time-limit", "10", "--no-expander-too", "--no-extension-too", "--growth", "10",
        "--out", str(out),
    ])  # fmt: skip
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    rows = report["results"]
    assert sorted((r["zipf_a"], r["expander"], r["extension"]) for r in rows) == [
        (z, m, e) for z in zipfs for m, e in ((False, True), (True, False), (True, True))]
    for zipf_a in zipfs:
        on, off = sorted((r for r in rows if r["zipf_a"] == zipf_a and r["extension"]), key=lambda r: not r["expander"])
        assert on["revisit_fraction"] == off["revisit_fraction"]  # one workload for both modes
        assert on["shares"].keys() >= set(TIER_ORDER)
        assert off["shares"]["dram"] == 0.0 and off["cache"]["dram"] is None
    for r in rows:
        assert 0.0 <= r["revisit_fraction"] < 1.0 and r["ranks"] == r["requests"] > 0 and r["errors"] == 0
        assert sum(r["shares"].values()) == pytest.approx(1.0)
        assert sum(r["tiers"].values()) == r["ranks"]
        computed = r["engine"]["prefill_events"] + r["engine"]["extended_events"]
        assert r["prefill_events_per_request"] == computed / r["ranks"]
    # With extension off no prefix is ever extended. Whether a run with it on extends depends on which
    # pre-infers the timing admitted (an overloaded CI machine can miss every returning user's prefix), so
    # what an extension computes is checked where it is deterministic: tests/relay/test_engine_fake.py and
    # tests/relay/test_engine.py (an extension runs only the events since the cached prefix).
    for r in rows:
        if not r["extension"]:
            assert (r["engine"]["extensions"], r["engine"]["extended_events"]) == (0, 0)
    by_zipf = {r["zipf_a"]: r["revisit_fraction"] for r in rows}
    assert by_zipf[2.0] > by_zipf[0.0]
    assert (tmp_path / "revisit.png").stat().st_size > 0 and (tmp_path / "revisit.config.yaml").is_file()
