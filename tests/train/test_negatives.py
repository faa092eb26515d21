"""Draws of negatives from a pool as loss weights: counts per pool item, accidental hits removed."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.train.negatives import negative_weights


def test_counts_each_draw_and_drops_the_targets_own_item() -> None:
    pool = np.array([7, 3, 9, 3])  # item 3 is in the pool twice
    pick = np.array([[0, 0, 2], [1, 3, 2], [2, 2, 2]])
    targets = np.array([5, 3, 0])
    got = negative_weights(pick, targets, pool)
    np.testing.assert_array_equal(got, [[2, 0, 1, 0],    # item 7 drawn twice, item 9 once
                                        [0, 0, 1, 0],    # both draws of item 3 are its target: gone
                                        [0, 0, 3, 0]])   # no target: the draws still count (masked later)
    assert got.dtype == np.uint8
    assert negative_weights(np.zeros((1, 300), int), np.array([1]), pool).dtype == np.uint16  # 300 draws


def test_leading_batch_dimensions_pair_each_row_with_its_own_pool() -> None:
    rng = np.random.default_rng(0)
    pools = rng.integers(1, 20, (3, 6))
    pick = rng.integers(0, 6, (3, 5, 4))
    targets = rng.integers(1, 20, (3, 5))
    got = negative_weights(pick, targets, pools)
    assert got.shape == (3, 5, 6)
    for b in range(3):
        np.testing.assert_array_equal(got[b], negative_weights(pick[b], targets[b], pools[b]))
        for n in range(5):
            want = np.zeros(6)
            for k in pick[b, n]:
                want[k] += pools[b, k] != targets[b, n]
            np.testing.assert_array_equal(got[b, n], want)


def test_draws_outside_the_pool_or_mismatched_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="pool of 3"):
        negative_weights(np.array([[0, 3]]), np.array([1]), np.array([4, 5, 6]))
    with pytest.raises(ValueError, match="do not match"):
        negative_weights(np.zeros((2, 2), int), np.array([1]), np.array([4, 5, 6]))
