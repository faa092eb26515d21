"""Forecasts of batched device steps (relay/batching.py), checked by hand against a small latency model."""

from __future__ import annotations

import pytest

from mindspore_relaygr.relay.batching import (
    RankForecast,
    batch_size,
    delay_of_first_ms,
    per_rank_cost,
    queue_share,
    step_ms,
    unpadded_size,
)
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


def test_a_batch_takes_the_size_that_costs_least_per_rank(latency):
    # factors 1, 0.8, 0.6 at 1, 2, 4: per rank 1 (1), 0.8 (2), 4 x 0.6 / 3 = 0.8 (3), 0.6 (4)
    assert [per_rank_cost(latency, n) for n in (1, 2, 3, 4)] == pytest.approx([1.0, 0.8, 0.8, 0.6])
    assert [batch_size(latency, n) for n in (1, 2, 3, 4)] == [1, 2, 3, 4]  # 3 ties with 2: the larger
    # factors measured on a 2-core CPU: three padded to four cost 1.11 single calls each, two 0.92
    cpu = LatencyModel(POINTS, batch_factors={1: 1.0, 2: 0.92, 4: 0.83, 8: 0.80})
    assert [batch_size(cpu, n) for n in range(1, 9)] == [1, 2, 2, 4, 4, 4, 4, 8]
    # a factor above 1 (a batch slower than its single calls) is never chosen
    assert batch_size(LatencyModel(POINTS, batch_factors={1: 1.0, 2: 1.3}), 2) == 1
    assert batch_size(LatencyModel(POINTS), 5) == 5  # nothing measured: all of them
    with pytest.raises(ValueError, match="available=0"):
        batch_size(latency, 0)


def test_unpadded_size_is_the_largest_bucket_within_what_is_queued():
    assert [unpadded_size([1, 2, 4, 8], n) for n in range(1, 10)] == [1, 2, 2, 4, 4, 4, 4, 8, 8]
    assert unpadded_size([2, 4], 1) == 1
    with pytest.raises(ValueError, match="available=0"):
        unpadded_size([1, 2], 0)


def test_queue_share_follows_the_sizes_the_device_thread_chooses(latency):
    assert queue_share(latency, 1, 4) == 1.0 and queue_share(latency, 8, 1) == 1.0
    assert queue_share(latency, 2, 4) == pytest.approx(0.8)
    assert queue_share(latency, 4, 4) == pytest.approx(0.6)
    assert queue_share(latency, 3, 4) == pytest.approx(4 * 0.6 / 3)  # three padded to four: 0.8 each, as two
    assert queue_share(latency, 6, 4) == pytest.approx((4 * 0.6 + 2 * 0.8) / 6)
    cpu = LatencyModel(POINTS, batch_factors={1: 1.0, 2: 0.92, 4: 0.83})
    assert queue_share(cpu, 3, 4) == pytest.approx((2 * 0.92 + 1) / 3)  # two, then one: not three padded to four
    assert queue_share(cpu, 7, 4) == pytest.approx((4 * 0.83 + 2 * 0.92 + 1) / 7)
    assert queue_share(LatencyModel(POINTS), 6, 4) == 1.0  # no batch factors measured
