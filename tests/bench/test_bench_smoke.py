"""Each `relaygr bench` command runs end to end on the tiny config and writes its JSON (no timing asserts)."""

from __future__ import annotations

import json

import pytest

from mindspore_relaygr.cli import main
from tests.conftest import CONFIGS, ONE_BUCKET, cli_overrides

pytestmark = pytest.mark.slow
TINY = str(CONFIGS / "tiny.yaml")
ONE_BUCKET_ARGS = cli_overrides(ONE_BUCKET)


def test_bench_model(tmp_path, capsys):
    out = tmp_path / "model.json"
    assert (
        main(
            [
                "bench",
                "model",
                "--config",
                TINY,
                "--prefix-lens",
                "64",
                "--candidates",
                "8",
                "--suffix",
                "8",
                "--repeats",
                "2",
                "--batch",
                "2",
                "-o",
                "trigger.prefill_chunk_len=24",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert {r["path"] for r in report["results"]} == {"full", "prefill", "cached", "cached_batch", "prefill_chunk",
                                                     "prefill_batch"}
    batched = [r for r in report["results"] if r["path"] == "cached_batch"]
    assert [r["batch"] for r in batched] == [2] and all(r["batch"] == 1 for r in report["results"][:3])
    # the last 24 events of a 64-token prefix (63 events after the user token), alone and for 2 users in one call
    chunked = [(r["path"], r["batch"], r["chunk_len"]) for r in report["results"] if r["path"].startswith("prefill_")]
    assert chunked == [("prefill_chunk", 1, 24), ("prefill_batch", 2, 24)]
    probes = report["matmul_gflops_all"]
    assert len(probes) == 1 + len(report["results"])  # before the sweep, then after every path
    assert report["matmul_gflops"] == max(probes) > 0
    assert (probes[0], probes[-1]) == (report["matmul_gflops_start"], report["matmul_gflops_end"])
    for i, row in enumerate(report["results"]):  # each graph's share of the run's fastest matmul measurement
        assert row["matmul_share"] == pytest.approx(row["gflops"] / report["matmul_gflops"])
        # ... and of the faster of the two measurements around it
        assert row["matmul_gflops_near"] == max(probes[i], probes[i + 1])
        assert row["near_share"] == pytest.approx(row["gflops"] / row["matmul_gflops_near"])
        assert row["near_share"] >= row["matmul_share"]
    # CPU with the kernels built: each path also ran under the kernel profile
    assert report["backend"] == "fused_cpu" and report["fused_kernels"]
    for row in report["results"]:
        assert row["gemm_gflops"] > 0 and row["gemm_flops_share"] > 0
        assert row["gemm_time_share"] > 0 and row["elementwise_time_share"] > 0
        assert row["gemm_time_share"] + row["elementwise_time_share"] <= row["kernel_time_share"]
    printed = capsys.readouterr().out
    assert "full/cached" in printed and "Kernel profile" in printed
    assert "B users per call (rank_cached_batch)" in printed and "B users per call (prefill_batch)" in printed
    assert (tmp_path / "model.config.yaml").is_file()
    assert (tmp_path / "model.png").stat().st_size > 10_000  # latency and share plot


def test_bench_cache(tmp_path):
    out = tmp_path / "cache.json"
    assert (
        main(
            [
                "bench",
                "cache",
                "--config",
                TINY,
                "--prefix-lens",
                "32",
                "64",
                "--slots",
                "2",
                "3",
                "--pool-prefix-len",
                "64",
                "--suffix",
                "8",
                "--repeats",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert [r["prefix_len"] for r in report["copy"]] == [32, 64]
    assert [r["num_slots"] for r in report["pool"]] == [2, 3]


def test_bench_engine(tmp_path):
    out = tmp_path / "engine.json"
    assert (
        main(
            [
                "bench",
                "engine",
                "--config",
                TINY,
                *ONE_BUCKET_ARGS,
                "-o",
                "trigger.slo_ms=1",
                "-o",
                "relay.max_online_len=32",
                "--loads",
                "20",
                "--requests",
                "12",
                "--users",
                "4",
                "--median-len",
                "40",
                "--max-len",
                "100",
                "--candidates",
                "16",
                "--time-limit",
                "10",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    modes = {r["mode"]: r for r in report["results"]}
    assert set(modes) == {"baseline", "relay"}
    assert modes["baseline"]["tiers"].keys() == {"bypass"} and modes["relay"]["errors"] == 0
    assert modes["relay"]["trigger"].get("admitted", 0) > 0
    assert report["longest_chunk_ms"] > 0 and report["prefill_chunk_len"] > 0
    for mode in modes.values():  # the device-queue wait of every rank is measured, never negative
        assert 0 <= mode["rank_queue_ms"]["p50"] <= mode["rank_queue_ms"]["max"]


HEADLINE = [
    "--config",
    TINY,
    *ONE_BUCKET_ARGS,
    "-o",
    "relay.max_online_len=32",
    "--requests",
    "10",
    "--users",
    "4",
    "--median-len",
    "40",
    "--max-len",
    "100",
    "--candidates",
    "16",
    "--gap-ms",
    "20",
    "--min-gap-ms",
    "5",
    "--time-limit",
    "10",
]


def test_bench_slo_throughput_with_ablation_and_plots(tmp_path):
    out = tmp_path / "slo.json"
    assert (
        main(
            [
                "bench",
                "slo-throughput",
                *HEADLINE,
                "--slo-ms",
                "auto",
                "--cap-events",
                "40",
                "--loads",
                "10",
                "20",
                "--ablation",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    rule, slo = res["slo_rule"], res["slo_throughput"]["slo_ms"]
    assert rule["cap_events"] == 40 and slo == res["slo_ms"]
    assert slo >= 2 * rule["full_ms_at_cap"] > slo - 5 and slo % 5 == 0  # 2x the timed cap, rounded up
    timing = res["cap_timing"]
    assert timing["cap_events"] == 40 and rule["full_ms_at_cap"] == timing["before"]["median_ms"]
    assert timing["before"]["calls"] == timing["after"]["calls"] == 40
    assert [r["slo_ms"] for r in res["slo_throughput"]["by_slo"]] == sorted({round(slo * k / 5) * 5 for k in (
        0.6, 0.8, 1.0, 1.25, 1.5, 2.0)})
    assert {p["mode"] for p in res["slo_throughput"]["points"]} == {"baseline", "relay"}
    assert [r["variant"] for r in res["ablation"]] == ["full", "no_trigger", "no_expander"]
    assert (tmp_path / "slo.png").stat().st_size > 0 and (tmp_path / "slo_ablation.png").stat().st_size > 0


def test_bench_max_seq(tmp_path):
    out = tmp_path / "seq.json"
    assert (
        main(
            [
                "bench",
                "max-seq",
                *HEADLINE,
                "--slo-ms",
                "60000",
                "--qps",
                "10",
                "--lengths",
                "20",
                "60",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())["max_seq"]
    assert res["max_len"] == {"baseline": 60, "relay": 60}  # a 60 s SLO: met at every length on any machine
    assert (tmp_path / "seq.png").stat().st_size > 0
