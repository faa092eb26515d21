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
