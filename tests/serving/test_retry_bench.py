"""`relaygr bench retry`: a connection resends a refused rank at once (fast, scripted answers), and the
whole harness on a fake engine (a few seconds; structure and counts, no timing)."""

from __future__ import annotations

import argparse
import json

import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError
from serving import retry_bench
from serving.overload_bench import rank_workload
from serving.retry_bench import RetrySpec, run_connection
from tests.conftest import CONFIGS
from tests.serving.servers import FAKE_FACTORY

TINY = CONFIGS / "tiny.yaml"


def test_a_refused_rank_is_resent_at_once_until_served_and_errors_move_on():
    requests_ = rank_workload(load_config(TINY), 10, 5, 20, 8, seed=0).requests
    answers = iter([503, 503, 200, 500, 503, 200])
    sent = []

    def send(req):
        sent.append(req)
        return next(answers)

    log = run_connection(send, requests_, offset=1, stride=3, done=lambda: len(sent) >= 6)
    assert sent == [requests_[1]] * 3 + [requests_[4]] + [requests_[7]] * 2  # the same rank again after a 503
    assert (len(log.ok_ms), len(log.first_try_to_ok_ms), len(log.refused_ms)) == (2, 2, 3)
    assert (log.resent, log.cut_off, log.errors) == (3, 0, ["HTTP 500"])


def test_a_refusal_at_the_end_of_the_run_is_not_resent():
    requests_ = rank_workload(load_config(TINY), 4, 2, 20, 8, seed=0).requests
    sent = []
    log = run_connection(lambda req: sent.append(req) or 503, requests_, 0, 1, done=lambda: len(sent) >= 3)
    assert len(sent) == 3 and (log.resent, log.cut_off) == (2, 1)


def test_bad_specs_are_refused(tmp_path):
    for bad in ({"connections": ()}, {"connections": (0,)}, {"seconds": 0.0}, {"warmup_s": -1.0}):
        with pytest.raises(ConfigError):
            RetrySpec(config_path=str(TINY), run_dir=tmp_path, **bad)


@pytest.mark.slow
def test_harness_on_a_fake_engine_reports_every_connection_count(tmp_path, monkeypatch):
    """A fake engine serving one rank per 20 ms with a 60 ms budget: 8 connections are refused and resend."""
    monkeypatch.setenv("RELAYGR_FAKE_RANK_MS", "20")
    out = tmp_path / "retry.json"
    parser = argparse.ArgumentParser(prog="relaygr bench")
    retry_bench.register(parser.add_subparsers(dest="bench", required=True))
    args = parser.parse_args(["retry", "--config", str(TINY), "--engine-factory", FAKE_FACTORY,
                              "-o", "trigger.slo_ms=100", "--connections", "2", "8", "--seconds", "1.5",
                              "--warmup-s", "0.5", "--median-len", "40", "--candidates", "8", "--out", str(out)])
    assert args.func(args) == 0
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").is_file() and out.with_suffix(".config.yaml").is_file()
    assert report["slo_ms"] == 100 and report["admission_fraction"] == 0.6 and report["machine"]
    assert [r["connections"] for r in report["rows"]] == [2, 8]
    for row in report["rows"]:
        assert row["ok"] > 0 and row["other_errors"] == 0 and row["ok_p99_ms"] is not None
        assert row["resent_at_once"] + row["refusals_cut_off"] == row["refused"]  # every refusal resent at once
        assert row["server"]["served"] == row["ok"] and row["server"]["cost_ms"] > 0
    busy = report["rows"][1]
    assert busy["refused"] > 0 and busy["resent_at_once"] > 0 and busy["refusal_p50_ms"] is not None
