"""Tail statistics: the P99 bootstrap interval and compliance judged on its upper end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mindspore_relaygr.bench import tailstats
from mindspore_relaygr.bench.tailstats import bracket, compliant_value, complies, percentile_interval, ratio_range


def test_the_interval_brackets_the_p99_and_narrows_with_more_samples():
    rng = np.random.default_rng(1)
    small = rng.exponential(10.0, 200)
    large = rng.exponential(10.0, 20000)
    est, low, high = percentile_interval(small)
    assert low <= est <= high and est == pytest.approx(np.percentile(small, 99))
    est_l, low_l, high_l = percentile_interval(large)
    assert high_l - low_l < (high - low) / 3  # 100x the samples: a much narrower interval
    # the true P99 of Exp(10) is 10 ln 100 = 46.05: inside the large sample's interval
    assert low_l <= 10 * math.log(100) <= high_l


def test_the_interval_is_reproducible_and_rejects_bad_settings():
    x = np.arange(1000, dtype=float)
    assert percentile_interval(x, seed=3) == percentile_interval(x, seed=3)
    assert all(math.isnan(v) for v in percentile_interval([]))
    for bad in ({"q": 100.0}, {"confidence": 1.0}, {"resamples": 0}):
        with pytest.raises(ValueError):
            percentile_interval(x, **bad)


def test_a_p99_of_100_samples_is_not_trusted_where_20000_are():
    """The same latency distribution, 6% of the budget's headroom: 100 ranks cannot show it."""
    rng = np.random.default_rng(7)
    budget = 1.06 * 10 * math.log(100)  # 6% above the true P99 of Exp(10)
    few = tailstats.p99_summary(rng.exponential(10.0, 100))
    many = tailstats.p99_summary(rng.exponential(10.0, 20000))
    point = {"errors": 0, "rejected_503": 0}
    assert not complies(point | few, budget) and complies(point | many, budget)


def _p(value: float, high: float, errors: int = 0) -> dict:
    return {"qps": value, "p99_high_ms": high, "errors": errors, "rejected_503": 0}


def test_the_compliant_value_is_the_top_of_the_unbroken_run_from_below():
    points = [_p(1, 50), _p(2, 80), _p(4, 120), _p(8, 90)]  # 8 is lucky, above a failure at 4
    assert compliant_value(points, "qps", 100) == 2 and bracket(points, "qps", 100) == (2, 4)
    assert compliant_value(points, "qps", 40) == 0 and bracket(points, "qps", 40) == (0, 1)
    assert bracket(points, "qps", 200) == (8, None)
    # a repeated value counts only if every run of it complies
    assert compliant_value([_p(1, 50), _p(2, 60), _p(2, 130)], "qps", 100) == 1
    assert compliant_value([_p(1, 50, errors=1)], "qps", 100) == 0


def test_ratio_range_follows_the_brackets():
    assert ratio_range((12, 16), (3, 6)) == (2.0, 16 / 3)
    low, high = ratio_range((12, None), (3, 6))
    assert low == 2.0 and math.isinf(high)
    low, high = ratio_range((12, 16), (0, 3))
    assert low == 4.0 and math.isinf(high)
    assert math.isnan(ratio_range((12, 16), (3, None))[0])
