"""Ranking metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mindspore_relaygr.train.metrics import (
    auc_from_scores,
    full_ranking_ranks,
    hit_rate_at_k,
    mrr,
    ndcg_at_k,
    rank_of_positive,
    ranking_metrics_at,
)


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


# Item ids 1..6; column 0 is padding and scores highest of all, but is never ranked.
SIX = np.array([[9.0, 0.5, 0.9, 0.3, 0.7, 0.8, 0.1]])


def test_full_ranking_hand_computed() -> None:
    # target 1 (0.5): items 2 (0.9), 5 (0.8) and 4 (0.7) score higher -> rank 4
    assert full_ranking_ranks(SIX, np.array([1]), [np.array([], np.int64)]).tolist() == [4]
    # the history holds 2 and 5: removed from the ranking -> only 4 is above -> rank 2
    assert full_ranking_ranks(SIX, np.array([1]), [np.array([2, 5])]).tolist() == [2]
    # the target is in the exclude list too: still ranked (1, 2 listed; 5 and 4 above it) -> rank 3
    assert full_ranking_ranks(SIX, np.array([1]), [np.array([1, 2])]).tolist() == [3]
    # padding id 0 in the history changes nothing; the best item ranks 1, the worst 6
    assert full_ranking_ranks(SIX, np.array([2]), [np.array([0, 0, 3])]).tolist() == [1]
    assert full_ranking_ranks(SIX, np.array([6]), [np.array([], np.int64)]).tolist() == [6]


def test_full_ranking_ties_are_pessimistic_and_rows_independent() -> None:
    scores = np.array([[0.0, 0.4, 0.4, 0.4, 0.1, 0.2, 0.4],
                       [0.0, 0.4, 0.4, 0.4, 0.1, 0.2, 0.4],
                       [5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    targets = np.array([2, 2, 4])
    # row 0: 1, 3 and 6 tie with the target -> rank 4; row 1: 3 excluded -> rank 3;
    # row 2: a constant scorer -> the worst rank among the 6 - 2 ranked items (1 and 6 excluded) -> 4
    excludes = [np.array([], np.int64), np.array([3, 5]), np.array([1, 6])]
    assert full_ranking_ranks(scores, targets, excludes).tolist() == [4, 3, 4]


def test_full_ranking_matches_a_loop() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 20, size=(30, 41)).astype(np.float32)  # many ties
    targets = rng.integers(1, 41, size=30)
    excludes = [rng.integers(0, 41, size=int(rng.integers(0, 15))) for _ in range(30)]
    expected = []
    for b in range(30):
        others = [j for j in range(1, 41) if j != targets[b] and j not in set(excludes[b].tolist())]
        expected.append(1 + sum(scores[b, j] >= scores[b, targets[b]] for j in others))
    assert full_ranking_ranks(scores, targets, excludes).tolist() == expected


def test_full_ranking_rejects_bad_input() -> None:
    none = [np.array([], np.int64)]
    with pytest.raises(ValueError, match="NaN"):
        full_ranking_ranks(np.array([[0.0, 0.1, np.nan]]), np.array([1]), none)
    with pytest.raises(ValueError, match="target ids"):
        full_ranking_ranks(SIX, np.array([0]), none)
    with pytest.raises(ValueError, match="target ids"):
        full_ranking_ranks(SIX, np.array([7]), none)
    with pytest.raises(ValueError, match="exclude ids"):
        full_ranking_ranks(SIX, np.array([1]), [np.array([7])])
    with pytest.raises(ValueError, match="exclude lists"):
        full_ranking_ranks(SIX, np.array([1]), none * 2)
    with pytest.raises(ValueError, match="shape"):
        full_ranking_ranks(np.zeros(7), np.array([1]), none)


def test_ranking_metrics_at_hand_computed() -> None:
    ranks = np.array([1, 3, 12, 60])
    m = ranking_metrics_at(ranks, ks=(10, 50, 200))
    assert set(m) == {"hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr"}
    assert m["hr@10"] == pytest.approx(2 / 4)
    assert m["hr@50"] == pytest.approx(3 / 4)
    assert m["hr@200"] == 1.0
    assert m["ndcg@10"] == pytest.approx((1.0 + 0.5) / 4)  # 1/log2(2) + 1/log2(4)
    assert m["ndcg@50"] == pytest.approx((1.0 + 0.5 + 1 / math.log2(13)) / 4)
    assert m["ndcg@200"] == pytest.approx((1.0 + 0.5 + 1 / math.log2(13) + 1 / math.log2(61)) / 4)
    assert m["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 12 + 1 / 60) / 4)
    assert ranking_metrics_at(np.array([2]), ks=(1,)) == {"hr@1": 0.0, "ndcg@1": 0.0, "mrr": 0.5}
