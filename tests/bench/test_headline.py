"""The SLO rule and the judging of headline points (plain Python, no model)."""

from __future__ import annotations

import math

import pytest

from mindspore_relaygr.bench.headline import best_by_slo, derive_slo_ms


class _Latency:
    def __init__(self, full_ms: float) -> None:
        self.full_ms, self.asked = full_ms, []

    def predict_full_ms(self, num_tokens: int, num_candidates: int) -> float:
        self.asked.append((num_tokens, num_candidates))
        return self.full_ms


def test_slo_is_twice_the_full_path_at_the_cap_rounded_up_to_5_ms():
    latency = _Latency(47.3)
    assert derive_slo_ms(latency, 1536, 128) == 95.0
    assert latency.asked == [(1536, 128)]
    assert derive_slo_ms(_Latency(50.0), 1536, 128) == 100.0  # already a multiple: not rounded further
    assert derive_slo_ms(_Latency(47.3), 1536, 128, factor=3.0, step_ms=1.0) == 142.0


@pytest.mark.parametrize("factor,step", [(0.0, 5.0), (2.0, 0.0), (-1.0, 5.0)])
def test_slo_rule_rejects_non_positive_settings(factor, step):
    with pytest.raises(ValueError, match="must be > 0"):
        derive_slo_ms(_Latency(40.0), 1536, 128, factor=factor, step_ms=step)


def _point(mode: str, qps: float, p99: float, errors: int = 0) -> dict:
    return {"mode": mode, "qps": qps, "p99_ms": p99, "errors": errors, "rejected_503": 0}


def test_best_by_slo_judges_the_same_points_at_each_budget():
    points = [_point("baseline", 2, 80), _point("baseline", 4, 120), _point("baseline", 8, 200),
              _point("relay", 2, 40), _point("relay", 4, 60), _point("relay", 8, 110, errors=1),
              _point("relay", 16, 140)]
    rows = {r["slo_ms"]: r for r in best_by_slo(points, "qps", [50, 100, 150, 250])}
    assert (rows[50]["baseline"], rows[50]["relay"]) == (0, 2) and math.isinf(rows[50]["ratio"])
    assert (rows[100]["baseline"], rows[100]["relay"], rows[100]["ratio"]) == (2, 4, 2.0)
    # 8 QPS has an error: never compliant for the relay, whatever the budget; 16 QPS complies at 150
    assert (rows[150]["baseline"], rows[150]["relay"], rows[150]["ratio"]) == (4, 16, 4.0)
    assert (rows[250]["baseline"], rows[250]["relay"], rows[250]["ratio"]) == (8, 16, 2.0)


def test_best_by_slo_with_no_compliant_point_is_nan():
    rows = best_by_slo([_point("baseline", 2, 300), _point("relay", 2, 300)], "qps", [100])
    assert rows[0]["baseline"] == rows[0]["relay"] == 0 and math.isnan(rows[0]["ratio"])
