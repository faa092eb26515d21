"""Ranking metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mindspore_relaygr.train.metrics import auc_from_scores, hit_rate_at_k, mrr, ndcg_at_k, rank_of_positive


def test_rank_of_positive() -> None:
    assert int(rank_of_positive(np.array([0.9, 0.1, 0.5]))) == 1
    assert int(rank_of_positive(np.array([0.2, 0.5, 0.1, 0.3]))) == 3
    assert int(rank_of_positive(np.array([0.1, 0.2, 0.9]), pos_index=2)) == 1
    assert int(rank_of_positive(np.array([0.1, 0.2, 0.9]), pos_index=-1)) == 1
    np.testing.assert_array_equal(rank_of_positive(np.array([[3.0, 1, 2], [1, 2, 3]])), [1, 3])


def test_rank_ties_are_pessimistic() -> None:
    assert int(rank_of_positive(np.array([0.5, 0.5, 0.1]))) == 2
    assert int(rank_of_positive(np.ones(101))) == 101  # a constant scorer gets the worst rank, not rank 1
    assert int(rank_of_positive(np.array([0.1, 0.5, 0.5, 0.5]), pos_index=1)) == 3


@pytest.mark.parametrize("bad", [np.array([]), np.zeros((2, 2, 2)), np.array([0.1, np.nan])])
def test_rank_rejects_bad_scores(bad: np.ndarray) -> None:
    with pytest.raises(ValueError):
        rank_of_positive(bad)
    with pytest.raises(ValueError, match="pos_index 3 is out of range"):
        rank_of_positive(np.zeros(3), pos_index=3)


def test_ndcg_hand_computed() -> None:
    assert ndcg_at_k(np.array([1]), 10) == 1.0
    assert ndcg_at_k(np.array([3]), 10) == pytest.approx(1 / math.log2(4)) == pytest.approx(0.5)
    assert ndcg_at_k(np.array([2]), 10) == pytest.approx(1 / math.log2(3))
    assert ndcg_at_k(np.array([11]), 10) == 0.0
    assert ndcg_at_k(np.array([10]), 10) == pytest.approx(1 / math.log2(11))
    assert ndcg_at_k(np.array([1, 3, 11]), 10) == pytest.approx(0.5)


def test_hit_rate_and_mrr_hand_computed() -> None:
    ranks = np.array([1, 3, 11])
    assert hit_rate_at_k(ranks, 1) == pytest.approx(1 / 3)
    assert hit_rate_at_k(ranks, 3) == pytest.approx(2 / 3)
    assert hit_rate_at_k(ranks, 10) == pytest.approx(2 / 3)
    assert hit_rate_at_k(ranks, 11) == 1.0
    assert mrr(np.array([1, 2, 4])) == pytest.approx((1 + 0.5 + 0.25) / 3)
    assert isinstance(mrr(ranks), float) and isinstance(ndcg_at_k(ranks, 5), float)
    assert hit_rate_at_k(rank_of_positive(np.array([0.2, 0.5, 0.1])), 2) == 1.0  # a 0-d rank works too


@pytest.mark.parametrize("fn", [lambda r: hit_rate_at_k(r, 5), lambda r: ndcg_at_k(r, 5), mrr])
def test_rank_metrics_reject_bad_ranks(fn) -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        fn(np.array([], dtype=int))
    with pytest.raises(ValueError, match="1-based"):
        fn(np.array([1, 0]))


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError, match="k must be >= 1"):
        hit_rate_at_k(np.array([1]), 0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        ndcg_at_k(np.array([1]), 0)


def test_auc_hand_computed() -> None:
    # user 1: 0.1 and 0.2 below, 0.5 tied (half), 0.9 above -> 2.5 / 4; user 2: all below -> 1
    pos = np.array([0.5, 1.0])
    neg = np.array([[0.1, 0.5, 0.9, 0.2], [0.0, 0.0, 0.0, 0.0]])
    assert auc_from_scores(pos[:1], neg[:1]) == pytest.approx(0.625)
    assert auc_from_scores(pos, neg) == pytest.approx((0.625 + 1.0) / 2)
    assert auc_from_scores(np.float64(0.5), np.array([0.1, 0.5, 0.9, 0.2])) == pytest.approx(0.625)
    assert auc_from_scores(np.array([1.0]), np.ones((1, 7))) == 0.5
    with pytest.raises(ValueError, match="expected pos"):
        auc_from_scores(np.array([1.0, 2.0]), np.ones((3, 4)))


def test_auc_matches_rank_without_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(50, 101))
    ranks = rank_of_positive(scores)
    expected = np.mean((100 - (ranks - 1)) / 100)  # negatives below the positive
    assert auc_from_scores(scores[:, 0], scores[:, 1:]) == pytest.approx(expected)
