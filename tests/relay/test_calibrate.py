"""Calibration of the latency model on the tiny model: batch factors per batch bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.model.inputs import buckets_up_to
from mindspore_relaygr.relay.calibrate import measure_batch_factors

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_batch_buckets_a_batch_can_pad_to():
    assert buckets_up_to([1, 2, 4, 8], 1) == [1]
    assert buckets_up_to([1, 2, 4, 8], 3) == [1, 2, 4]
    assert buckets_up_to([1, 2, 4, 8], 4) == [1, 2, 4]
    assert buckets_up_to([1, 2, 4, 8], 8) == [1, 2, 4, 8]


@pytest.mark.slow
def test_batch_factors_are_measured_for_every_bucket_up_to_max_batch_on_one_slot():
    from mindspore_relaygr.model import RelayGRModel

    model = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=1"]))  # one slot serves every user
    factors = measure_batch_factors(model, prefill_chunk_len=64, max_batch=3, repeats=1)
    assert sorted(factors) == [1, 2, 4] and factors[1] == 1.0
    assert all(0 < f < float("inf") for f in factors.values())
    assert model.slot_events(0) > 0  # the caller releases the slot
