"""`relaygr bench batching` on the tiny model: closed-loop runs with and without batched ranks, alternating."""

from __future__ import annotations

import json

import pytest

from mindspore_relaygr.bench.batch_bench import _pooled_low_load, closed_loop, open_loop, poisson_arrivals
from mindspore_relaygr.cli import main
from tests.conftest import CONFIGS


def test_closed_loop_counts_what_each_client_got_back():
    seen = []

    def rank(k: int) -> str:
        seen.append(k)
        return "device" if k % 2 else "miss"

    out = closed_loop(rank, clients=3, seconds=0.5)
    assert out["ranks"] == len(seen) > 0 and sum(out["tiers"].values()) == out["ranks"]
    assert out["ranks_per_s"] == pytest.approx(out["ranks"] / out["seconds"])
    assert {k % 3 for k in seen} == {0, 1, 2}  # every client ranked


def test_poisson_arrivals_are_seeded_ordered_and_cycle_through_the_users():
    a = poisson_arrivals(qps=50.0, requests=2000, users=3, seed=1)
    at = [r.at_s for r in a.requests]
    assert at == sorted(at) and at[0] > 0
    assert len(at) / at[-1] == pytest.approx(50.0, rel=0.1)  # the mean rate is the one asked for
    assert [r.user for r in a.requests[:6]] == [0, 1, 2, 0, 1, 2]
    assert at == [r.at_s for r in poisson_arrivals(50.0, 2000, 3, seed=1).requests]  # both modes replay the same
    assert at != [r.at_s for r in poisson_arrivals(50.0, 2000, 3, seed=2).requests]
    with pytest.raises(ValueError, match="positive"):
        poisson_arrivals(0.0, 10, 3)


def test_open_loop_measures_from_the_schedule_and_refuses_failures():
    users = []

    def rank(user: int) -> str:
        users.append(user)
        return "device"

    out = open_loop(rank, poisson_arrivals(qps=200.0, requests=40, users=4))
    assert out["ranks"] == 40 == len(out["latencies_ms"]) and out["tiers"] == {"device": 40}
    assert sorted(users) == sorted(k % 4 for k in range(40))
    assert out["p99_low_ms"] <= out["p99_ms"] <= out["p99_high_ms"] and out["samples"] == 40

    def broken(user: int) -> str:
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="40 of 40 low-load ranks failed, e.g. RuntimeError: device lost"):
        open_loop(broken, poisson_arrivals(qps=200.0, requests=40, users=4))


def test_low_load_ratio_pools_every_round_of_each_mode():
    def run(r: int, size: int, ms: float) -> dict:
        return {"round": r, "max_rank_batch": size, "p99_ms": ms, "latencies_ms": [ms] * 100}

    # Pooled P99 of (10 x100, 30 x100) is 30 for batch 4; of (20 x100, 20 x100) 20 for batch 1.
    low = _pooled_low_load([run(0, 1, 20.0), run(0, 4, 10.0), run(1, 4, 30.0), run(1, 1, 20.0)], batch=4)
    assert low["batched"]["p99_ms"] == pytest.approx(30.0) and low["unbatched"]["p99_ms"] == pytest.approx(20.0)
    assert low["p99_ratio"] == pytest.approx(1.5)
    assert low["p99_ratios"] == pytest.approx([0.5, 1.5])


@pytest.mark.slow
def test_bench_batching_end_to_end_on_tiny(tmp_path, capsys):
    out = tmp_path / "batching.json"
    # One suffix and one candidate bucket, two length buckets: the warm-up compiles what the bench uses, not every
    # bucket of tiny.
    assert main(["bench", "batching", "--config", str(CONFIGS / "tiny.yaml"), "-o", "model.suffix_buckets=[8]",
                 "-o", "model.candidate_buckets=[8]", "-o", "model.len_buckets=[64, 128]", "--users", "4",
                 "--clients", "4", "--events", "60", "--suffix", "8", "--candidates", "8", "--batch", "4",
                 "--seconds", "0.5", "--rounds", "2", "--low-qps", "40", "--low-requests", "30",
                 "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["round"], r["max_rank_batch"]) for r in runs] == [(0, 1), (0, 4), (1, 4), (1, 1)]  # alternating
    for r in runs:
        assert r["ranks"] > 0 and r["tiers"] == {"device": r["ranks"]}  # every rank from its slot
        sizes = {int(size): n for size, n in r["batches"].items()}
        assert sum(size * n for size, n in sizes.items()) == r["ranks"]  # every rank ran in some device call
        assert max(sizes) <= r["max_rank_batch"]
    assert len(report["ratios"]) == 2 and report["ratio_range"][0] <= report["ratio_median"] <= report["ratio_range"][1]
    low = report["low_load"]
    assert [(r["round"], r["max_rank_batch"]) for r in low["runs"]] == [(0, 1), (0, 4), (1, 4), (1, 1)]
    for r in low["runs"]:
        assert r["ranks"] == 30 and r["tiers"] == {"device": 30}
        assert sum(int(size) * n for size, n in r["batches"].items()) == 30  # this phase's device calls only
        assert max(int(size) for size in r["batches"]) <= r["max_rank_batch"]
    assert low["p99_ratio"] == pytest.approx(low["batched"]["p99_ms"] / low["unbatched"]["p99_ms"])
    assert low["batched"]["samples"] == low["unbatched"]["samples"] == 60
    assert sorted(report["batch_factors"]) == ["1", "2", "4"] and all(f > 0 for f in report["batch_factors"].values())
    assert set(report["machine"]) >= {"cpu_model", "cores", "matmul_gflops", "mindspore"}
    assert (tmp_path / "batching.png").stat().st_size > 0 and (tmp_path / "batching.config.yaml").is_file()
    printed = capsys.readouterr().out
    assert "ranks/s with max_rank_batch 4 over 1" in printed and "low-load P99, all rounds: batched" in printed
