"""Sampled-softmax negatives as loss weights (numpy only).

A sequence scores one pool of P uniformly sampled items; each of its positions draws its K negatives from
that pool. The loss (`train.losses.sampled_softmax_loss`) takes the draws as weights [N, P]: how many times
each position drew each pool item, with the position's accidental hits (a pool item equal to its target)
set to 0. Summing weight * exp(logit) over the pool is the softmax over the K drawn negatives, without
gathering [N, K] logits in the graph.
"""

from __future__ import annotations

import numpy as np

__all__ = ["negative_weights", "weight_dtype"]


def weight_dtype(num_draws: int) -> type[np.unsignedinteger]:
    """The narrowest dtype that counts `num_draws` draws: uint8 sends the graph a quarter of float32's bytes."""
    return np.uint8 if num_draws <= np.iinfo(np.uint8).max else np.uint16


def negative_weights(pick: np.ndarray, pos_ids: np.ndarray, neg_ids: np.ndarray) -> np.ndarray:
    """Weights [..., N, P] (`weight_dtype(K)`) of the draws `pick` [..., N, K] (indices into the pool, with replacement)
    of positions with targets `pos_ids` [..., N] from the pool `neg_ids` [..., P]."""
    *lead, n, k = pick.shape
    p = neg_ids.shape[-1]
    if pos_ids.shape != (*lead, n) or neg_ids.shape[:-1] != tuple(lead):
        raise ValueError(f"pick {pick.shape}, targets {pos_ids.shape} and pool {neg_ids.shape} do not match")
    if pick.size and not 0 <= pick.min() <= pick.max() < p:
        raise ValueError(f"draws must index the pool of {p} items")
    rows = pick.reshape(-1, k).astype(np.int64)
    flat = (np.arange(rows.shape[0])[:, None] * p + rows).ravel()
    weights = np.bincount(flat, minlength=rows.shape[0] * p).astype(weight_dtype(k)).reshape(*lead, n, p)
    weights[pos_ids[..., :, None] == neg_ids[..., None, :]] = 0
    return weights
