"""Histories are oldest event first: timestamps may repeat but never go backwards (numpy only, no MindSpore)."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import InvalidRequest
from mindspore_relaygr.model.inputs import synthetic_history, validate_history
from tests.conftest import CONFIGS, random_history


@pytest.fixture(scope="module")
def model_config():
    return load_config(CONFIGS / "tiny.yaml").model


def test_equal_timestamps_are_allowed(model_config):
    hist = random_history(np.random.default_rng(0), 20, user_features=[1, 1])
    hist["timestamps"][3:8] = hist["timestamps"][3]  # several events in the same second
    assert len(validate_history(model_config, hist)) == 20


def test_a_timestamp_going_backwards_is_refused_naming_it(model_config):
    hist = random_history(np.random.default_rng(1), 20, user_features=[1, 1])
    hist["timestamps"][7] = hist["timestamps"][6] - 1
    with pytest.raises(InvalidRequest) as err:
        validate_history(model_config, hist, "prefix_history")
    assert err.value.field == "prefix_history.timestamps"
    assert "oldest event first" in err.value.message and "index 7" in err.value.message


@pytest.mark.parametrize("seed", range(5))
def test_generated_histories_are_in_order(model_config, seed):
    """What the demo, the benches and the calibration send."""
    hist = synthetic_history(model_config, 200, seed)
    assert np.all(np.diff(hist["timestamps"]) >= 0)
    validate_history(model_config, hist)
