"""`relaygr bench batching` on the tiny model: closed-loop runs with and without batched ranks, alternating."""

from __future__ import annotations

import json

import pytest

from mindspore_relaygr.bench.batch_bench import closed_loop
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


@pytest.mark.slow
def test_bench_batching_end_to_end_on_tiny(tmp_path, capsys):
    out = tmp_path / "batching.json"
    # One suffix and one candidate bucket, two length buckets: the warm-up compiles what the bench uses, not every
    # bucket of tiny.
    assert main(["bench", "batching", "--config", str(CONFIGS / "tiny.yaml"), "-o", "model.suffix_buckets=[8]",
                 "-o", "model.candidate_buckets=[8]", "-o", "model.len_buckets=[64, 128]", "--users", "4",
                 "--clients", "4", "--events", "60", "--suffix", "8", "--candidates", "8", "--batch", "4",
                 "--seconds", "0.5", "--rounds", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert [(r["round"], r["max_rank_batch"]) for r in runs] == [(0, 1), (0, 4), (1, 4), (1, 1)]  # alternating
    for r in runs:
        assert r["ranks"] > 0 and r["tiers"] == {"device": r["ranks"]}  # every rank from its slot
        sizes = {int(size): n for size, n in r["batches"].items()}
        assert sum(size * n for size, n in sizes.items()) == r["ranks"]  # every rank ran in some device call
        assert max(sizes) <= r["max_rank_batch"]
    assert len(report["ratios"]) == 2 and report["ratio_range"][0] <= report["ratio_median"] <= report["ratio_range"][1]
    assert sorted(report["batch_factors"]) == ["1", "2", "4"] and all(f > 0 for f in report["batch_factors"].values())
    assert set(report["machine"]) >= {"cpu_model", "cores", "matmul_gflops", "mindspore"}
    assert (tmp_path / "batching.png").stat().st_size > 0 and (tmp_path / "batching.config.yaml").is_file()
    assert "ranks/s with max_rank_batch 4 over 1" in capsys.readouterr().out
