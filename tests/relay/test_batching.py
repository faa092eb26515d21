"""Forecasts of batched device steps (relay/batching.py), checked by hand against a small latency model."""

from __future__ import annotations

import pytest

from mindspore_relaygr.relay.batching import RankForecast, delay_of_first_ms, queue_share, step_ms
from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

POINTS = [LatencyPoint("full", 128, 32, 0, 40.0), LatencyPoint("relay", 128, 32, 16, 10.0),
          LatencyPoint("relay", 256, 32, 16, 20.0)]


@pytest.fixture
def latency() -> LatencyModel:
    return LatencyModel(POINTS, batch_factors={1: 1.0, 2: 0.8, 4: 0.6})


def test_a_rank_alone_costs_its_serial_work_and_its_cached_call(latency):
    assert RankForecast(40.0).alone_ms(latency) == 40.0  # a miss
    assert RankForecast(3.0, (256, 16, 32)).alone_ms(latency) == 23.0  # a DRAM copy, then the cached call


def test_a_step_runs_the_serial_work_then_one_batched_call(latency):
    a, b, miss = RankForecast(0.0, (128, 16, 32)), RankForecast(2.0, (256, 16, 32)), RankForecast(40.0)
    assert step_ms(latency, [a, b, miss]) == pytest.approx(2.0 + 40.0 + 2 * 0.8 * 20.0)
    # the first (a, 10 ms alone) finishes 2 + 40 + 32 - 10 ms later than alone
    assert delay_of_first_ms(latency, [a, b, miss]) == pytest.approx(64.0)
    assert delay_of_first_ms(latency, [a]) == 0.0
    # two of the same shape: 2 x 0.8 x 10 = 16 ms, the first 6 ms late
    assert delay_of_first_ms(latency, [a, a]) == pytest.approx(6.0)


def test_queue_share_counts_full_batches_then_the_rest_padded_to_its_bucket(latency):
    assert queue_share(latency, 1, 4) == 1.0 and queue_share(latency, 8, 1) == 1.0
    assert queue_share(latency, 2, 4) == pytest.approx(0.8)
    assert queue_share(latency, 4, 4) == pytest.approx(0.6)
    assert queue_share(latency, 3, 4) == pytest.approx(4 * 0.6 / 3)  # padded to 4: worse than one at a time
    assert queue_share(latency, 6, 4) == pytest.approx((4 * 0.6 + 2 * 0.8) / 6)
    assert queue_share(LatencyModel(POINTS), 6, 4) == 1.0  # no batch factors measured
