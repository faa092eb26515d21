"""serving.overhead: alternating timing rounds (no MindSpore) and one end-to-end run on the tiny config."""

from __future__ import annotations

import json

import pytest

from serving import overhead
from tests.conftest import CONFIGS, ONE_BUCKET, cli_overrides


def test_rounds_alternate_and_warm_up_is_not_kept():
    calls: list[str] = []

    def http_rank() -> tuple[float, float, str]:
        calls.append("h")
        return float(len(calls)), 1.0, "device"

    def local_rank() -> tuple[float, str]:
        calls.append("l")
        return float(len(calls)), "device"

    timed = overhead._time_alternating(http_rank, local_rank, repeats=5, round_len=2, warmup=1)
    assert "".join(calls) == "hl" + "hhll" + "hhll" + "hl"  # warm-up, then rounds of 2, the last one short
    assert timed["e2e"] == [3.0, 4.0, 7.0, 8.0, 11.0]  # the warm-up calls (1, 2) are not kept
    assert timed["local"] == [5.0, 6.0, 9.0, 10.0, 12.0]
    assert timed["http_tiers"] == "device" and timed["local_tiers"] == ["device"]


def test_repeats_must_be_positive():
    with pytest.raises(SystemExit):
        overhead.main(["--repeats", "0"])


@pytest.mark.slow
def test_overhead_runs_end_to_end(tmp_path, capsys):
    """One instance on 127.0.0.1 (stopped by PID) against the same engine in process, both from the device
    cache."""
    out = tmp_path / "overhead.json"
    assert overhead.main(["--config", str(CONFIGS / "tiny.yaml"), *cli_overrides(ONE_BUCKET), "--prefix-len",
                          "48", "--suffix", "8", "--candidates", "8", "--repeats", "6", "--round", "4", "--log",
                          str(tmp_path / "server.log"), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["http_tiers"] == "device" and report["in_process_tiers"] == ["device"]
    assert (report["repeats"], report["round"]) == (6, 4)
    assert report["ratio_p50"] == pytest.approx(report["http_e2e_ms"]["p50"] / report["in_process_ms"]["p50"])
    assert report["machine"]["cores"] >= 1
    assert "RelayEngine.rank in process" in capsys.readouterr().out
