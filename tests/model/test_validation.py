"""Bad caller input raises InvalidRequest (a ValueError) naming the field; nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.errors import InvalidRequest
from tests.conftest import random_history

pytestmark = pytest.mark.slow


def _hist(n=10, **over):
    hist = random_history(np.random.default_rng(0), n, user_features=[1, 1])
    hist.update(over)
    return hist


@pytest.mark.parametrize(("history", "field"), [
    (_hist(item_ids=np.r_[np.ones(9, int), 201]), "history.item_ids"),
    (_hist(item_ids=np.r_[np.ones(9, int), 0]), "history.item_ids"),
    (_hist(action_ids=np.r_[np.zeros(9, int), 4]), "history.action_ids"),
    (_hist(timestamps=np.r_[np.zeros(9), np.nan]), "history.timestamps"),
    (_hist(item_ids=np.ones(9, int)), "history"),
    (_hist(user_features=[3, 0]), "history.user_features[0]"),
    (_hist(user_features=[1]), "history.user_features"),
    (_hist(item_ids=np.ones((2, 5), int)), "history.item_ids"),
    ({"item_ids": [1], "action_ids": [0]}, "history.timestamps"),
    (_hist(n=128), "history"),
])
def test_rank_full_rejects_bad_history(tiny_model, history, field):
    with pytest.raises(InvalidRequest) as err:
        tiny_model.rank_full(history, [1, 2])
    assert err.value.field == field


@pytest.mark.parametrize(("cands", "field"), [([], "candidate_ids"), (np.ones(33, int), "candidate_ids"),
                                              ([0], "candidate_ids"), ([1.5], "candidate_ids")])
def test_rank_full_rejects_bad_candidates(tiny_model, cands, field):
    with pytest.raises(InvalidRequest) as err:
        tiny_model.rank_full(_hist(), cands)
    assert err.value.field == field


def test_cached_path_rejects_bad_slot_and_lengths(tiny_model):
    tiny_model.prefill(0, _hist(20))
    with pytest.raises(ValueError, match="slot=4"):
        tiny_model.prefill(4, _hist())
    with pytest.raises(InvalidRequest) as err:
        tiny_model.rank_cached(0, 21, _hist(1), [1])
    assert err.value.field == "prefix_len"
    with pytest.raises(InvalidRequest) as err:
        tiny_model.rank_cached(0, 20, _hist(17), [1])
    assert err.value.field == "suffix_history"
    with pytest.raises(InvalidRequest) as err:
        tiny_model.prefill(1, _hist(30), start=40)
    assert err.value.field == "start"
    tiny_model.release_slot(2)
    with pytest.raises(InvalidRequest, match="holds 0 events"):
        tiny_model.prefill(2, _hist(30), start=10)
