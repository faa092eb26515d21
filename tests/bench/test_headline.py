"""The SLO rule and the judging of headline points (plain Python, no model)."""

from __future__ import annotations

import math

import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.bench import headline
from mindspore_relaygr.bench.headline import best_by_slo, derive_slo_ms
from tests.conftest import CONFIGS


def test_slo_is_twice_the_full_path_at_the_cap_rounded_up_to_5_ms():
    assert derive_slo_ms(47.3) == 95.0
    assert derive_slo_ms(50.0) == 100.0  # already a multiple: not rounded further
    assert derive_slo_ms(47.3, factor=3.0, step_ms=1.0) == 142.0


@pytest.mark.parametrize("full_ms,factor,step", [(40.0, 0.0, 5.0), (40.0, 2.0, 0.0), (40.0, -1.0, 5.0),
                                                 (0.0, 2.0, 5.0), (float("nan"), 2.0, 5.0)])
def test_slo_rule_rejects_non_positive_settings(full_ms, factor, step):
    with pytest.raises(ValueError, match="must be > 0"):
        derive_slo_ms(full_ms, factor=factor, step_ms=step)


class _Clock:
    """perf_counter stand-in: each fake model call advances it by the next scripted duration."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    @staticmethod
    def sleep(_seconds: float) -> None:
        pass


class _Model:
    def __init__(self, clock: _Clock, durations_ms: list[float]) -> None:
        self.cfg = load_config(CONFIGS / "tiny.yaml").model
        self.clock, self.durations, self.calls = clock, list(durations_ms), []

    def rank_full(self, history: dict, candidates) -> None:
        self.calls.append((len(history["item_ids"]), len(candidates)))
        self.clock.now += self.durations.pop(0) / 1e3


def test_time_full_path_reports_the_median_of_the_timed_calls(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(headline, "time", clock)
    # the first (untimed) call is slow on purpose: it must not enter the statistics
    model = _Model(clock, [500.0, 40.0, 90.0, 45.0, 50.0, 41.0])
    out = headline.time_full_path(model, 30, 7, calls=5)
    assert model.calls == [(30, 7)] * 6
    assert out["calls"] == 5 and out["median_ms"] == pytest.approx(45.0) and out["max_ms"] == pytest.approx(90.0)
    with pytest.raises(ValueError, match="calls=0"):
        headline.time_full_path(model, 30, 7, calls=0)


def _point(mode: str, qps: float, p99_high: float, errors: int = 0) -> dict:
    """A measured point whose P99 interval ends at `p99_high` (judging reads the upper end)."""
    return {"mode": mode, "qps": qps, "p99_ms": p99_high - 10, "p99_low_ms": p99_high - 20, "p99_high_ms": p99_high,
            "samples": 1000, "errors": errors, "rejected_503": 0}


def test_best_by_slo_judges_the_same_points_at_each_budget_on_the_interval_s_upper_end():
    points = [_point("baseline", 2, 80), _point("baseline", 4, 120), _point("baseline", 8, 200),
              _point("relay", 2, 40), _point("relay", 4, 60), _point("relay", 8, 110, errors=1),
              _point("relay", 16, 140)]
    rows = {r["slo_ms"]: r for r in best_by_slo(points, "qps", [50, 100, 150, 250])}
    assert (rows[50]["baseline"], rows[50]["relay"]) == (0, 2) and math.isinf(rows[50]["ratio"])
    assert (rows[100]["baseline"], rows[100]["relay"], rows[100]["ratio"]) == (2, 4, 2.0)
    # 8 QPS has an error: the relay's compliant load stops below it at every budget, though 16 QPS
    # would meet 150 ms on its own (a lucky point above a failing one does not count)
    assert (rows[150]["baseline"], rows[150]["relay"], rows[150]["ratio"]) == (4, 4, 1.0)
    assert rows[150]["first_failing"] == {"baseline": 8, "relay": 8}
    assert rows[150]["ratio_range"] == [0.5, 2.0]  # relay 4 / baseline 8 .. relay 8 / baseline 4
    assert (rows[250]["baseline"], rows[250]["relay"]) == (8, 4)
    assert rows[250]["first_failing"] == {"baseline": None, "relay": 8}
    assert math.isnan(rows[250]["ratio_range"][0]) and rows[250]["ratio_range"][1] == 1.0


def test_best_by_slo_with_no_compliant_point_is_nan():
    rows = best_by_slo([_point("baseline", 2, 300), _point("relay", 2, 300)], "qps", [100])
    assert rows[0]["baseline"] == rows[0]["relay"] == 0 and math.isnan(rows[0]["ratio"])


def test_ratio_labels_say_what_the_grid_shows():
    assert headline.ratio_label(4.0, [2.0, 5.0]) == "4.00x"
    assert headline.ratio_label(float("inf"), [3.0, float("inf")]) == ">= 3.00x"
    assert headline.ratio_label(float("inf"), [float("nan"), float("inf")]) == "unbounded"
    assert headline.ratio_label(float("nan"), [float("nan"), float("nan")]) == "n/a"


def _stub_sweep(monkeypatch, p99_of: dict[str, callable], axis: str = "qps") -> list[tuple[float, tuple]]:
    """Replace the engine runs of the sweeps by P99s from `p99_of[mode](x)`, x the workload's QPS (or, with
    axis="length", its history length); returns the runs made as (x, modes)."""
    runs: list[tuple[float, tuple[str, ...]]] = []

    def fake_pair(config, model, latency, workload, first_relay, time_limit_s, relay_config=None, modes=headline.MODES):
        x = workload.spec.qps if axis == "qps" else workload.spec.max_len
        runs.append((x, modes))
        out = {}
        for m in modes:
            p = _point(m, x, p99_of[m](x))
            stats = {k: v for k, v in p.items() if k not in ("mode", "qps")}
            out[m] = stats | {"hit_rate": 0.0, "steps": {}, "tiers": {}}
        return out

    monkeypatch.setattr(headline, "_pair", fake_pair)
    monkeypatch.setattr(headline, "longest_step", lambda s: "-")
    return runs


def _spec():
    from mindspore_relaygr.bench.workload import WorkloadSpec
    return WorkloadSpec(num_users=4, num_requests=4, qps=1.0, median_len=8, max_len=16, min_len=4,
                        num_candidates=4, num_items=50)


def test_the_baseline_sweeps_its_own_loads_and_each_mode_stops_when_it_fails_the_largest_budget(monkeypatch):
    # budget 100 ms: grid 60..200 ms. Baseline P99 grows 60 ms per QPS, relay 10 ms per QPS.
    runs = _stub_sweep(monkeypatch, {"baseline": lambda q: 60 * q, "relay": lambda q: 10 * q})
    res = headline.slo_throughput(load_config(CONFIGS / "tiny.yaml"), None, None, _spec(), [3, 6, 9], 100.0,
                                  None, lambda _: None, baseline_loads=[1, 2, 3])
    # baseline: 1 and 2 only on its own, 3 together with the relay, then 4.5 (it still met 200 ms at 3: 180 ms)
    # and it stops there (270 ms > 200); the relay goes on 1.5x at a time past 9 until it fails 200 ms (>= 20 QPS)
    assert runs == [(1, ("baseline",)), (2, ("baseline",)), (3, ("baseline", "relay")), (4.5, ("baseline",)),
                    (6, ("relay",)), (9, ("relay",)), (13.5, ("relay",)), (20.25, ("relay",))]
    assert res["compliant_qps"] == {"baseline": 1, "relay": 9}
    assert res["first_failing_qps"] == {"baseline": 2, "relay": 13.5}
    assert res["ratio"] == 9.0 and res["ratio_range"] == [4.5, 13.5]


def test_without_baseline_loads_both_modes_sweep_the_same_loads(monkeypatch):
    runs = _stub_sweep(monkeypatch, {"baseline": lambda q: 60 * q, "relay": lambda q: 10 * q})
    headline.slo_throughput(load_config(CONFIGS / "tiny.yaml"), None, None, _spec(), [1, 4, 8], 100.0,
                            None, lambda _: None)
    assert runs[:3] == [(1, ("baseline", "relay")), (4, ("baseline", "relay")), (8, ("relay",))]


@pytest.mark.parametrize("text", ["0", "-2", "nan", "inf", "three"])
def test_loads_must_be_finite_and_positive(text, capsys):
    from mindspore_relaygr.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "slo-throughput", "--baseline-loads", text])
    assert text in capsys.readouterr().err


def test_max_seq_baseline_sweeps_its_own_lengths_and_stops_at_the_last_given_one(monkeypatch):
    # budget 100 ms (grid 60..200): baseline P99 0.1 ms per event, relay 0.02 ms per event
    runs = _stub_sweep(monkeypatch, {"baseline": lambda n: 0.1 * n, "relay": lambda n: 0.02 * n}, axis="length")
    res = headline.max_seq(load_config(CONFIGS / "tiny.yaml"), None, None, _spec(), [1024, 2048, 4096], 1.0, 100.0,
                           None, lambda _: None, baseline_lengths=[512, 1024, 1536])
    # the baseline is over 100 ms from 1024 events but within 200 ms, so it runs 1536 too; nothing past the
    # given lengths (a model has no bucket beyond its longest), so the relay's 4096 is a lower bound
    assert runs == [(512, ("baseline",)), (1024, ("baseline", "relay")), (1536, ("baseline",)),
                    (2048, ("relay",)), (4096, ("relay",))]
    assert res["max_len"] == {"baseline": 512, "relay": 4096}
    assert res["ratio"] == 8.0
    assert [p["length"] for p in res["points"] if p["mode"] == "baseline"] == [512, 1024, 1536]


def test_max_seq_mode_stops_once_it_fails_the_largest_budget(monkeypatch):
    runs = _stub_sweep(monkeypatch, {"baseline": lambda n: 0.3 * n, "relay": lambda n: 0.02 * n}, axis="length")
    res = headline.max_seq(load_config(CONFIGS / "tiny.yaml"), None, None, _spec(), [512, 1024, 2048], 1.0, 100.0,
                           None, lambda _: None)
    # baseline: 154 ms at 512 (within 200), 307 ms at 1024 (over 200): it stops, 2048 runs the relay alone
    assert runs == [(512, ("baseline", "relay")), (1024, ("baseline", "relay")), (2048, ("relay",))]
    assert res["max_len"] == {"baseline": 0, "relay": 2048}  # 0: no length complies


@pytest.mark.parametrize("flag,text", [("--baseline-lengths", "0"), ("--baseline-lengths", "-5"),
                                       ("--lengths", "1.5"), ("--lengths", "long"), ("--qps", "0"), ("--qps", "nan")])
def test_max_seq_lengths_and_load_are_checked(flag, text, capsys):
    from mindspore_relaygr.cli import build_parser
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "max-seq", flag, text])
    assert text in capsys.readouterr().err


def test_max_seq_ranks_every_history_whole_even_with_a_truncating_config(monkeypatch, tmp_path, capsys):
    """A truncated rank does not serve the length under test: `bench max-seq` runs relay.miss_policy=full."""
    from mindspore_relaygr import cli
    from mindspore_relaygr.bench import plots

    seen = {}

    def fake_max_seq(cfg, *args, **kwargs):
        seen["policy"] = cfg.relay.miss_policy
        return {"points": []}

    monkeypatch.setattr(headline, "prepare", lambda cfg, say: (None, None))
    monkeypatch.setattr(headline, "time_full_path",
                        lambda *a, **k: {"median_ms": 10.0, "calls": 1, "p90_ms": 10.0, "max_ms": 10.0})
    monkeypatch.setattr(headline, "max_seq", fake_max_seq)
    monkeypatch.setattr(headline, "format_report", lambda report: "")
    monkeypatch.setattr(plots, "plot_max_seq", lambda res, path: None)
    out = tmp_path / "max_seq.json"
    assert cli.main(["bench", "max-seq", "--config", str(CONFIGS / "tiny.yaml"), "-o", "relay.miss_policy=truncate",
                     "--out", str(out)]) == 0
    assert seen["policy"] == "full"
    assert load_config(out.with_suffix(".config.yaml")).relay.miss_policy == "full"
    assert "relay.miss_policy truncate -> full" in capsys.readouterr().out
