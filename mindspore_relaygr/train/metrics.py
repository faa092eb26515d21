"""Ranking metrics for one positive among sampled negatives (numpy only).

Ranks are 1-based. `rank_of_positive` breaks ties pessimistically: every other candidate whose score
equals the positive's ranks above it, so a constant scorer gets the worst rank instead of rank 1.
"""

from __future__ import annotations

import numpy as np


def rank_of_positive(scores: np.ndarray, pos_index: int = 0) -> np.ndarray:
    """scores [C] or [B, C] -> int64 ranks of shape [] or [B]: 1 + #other candidates scoring >= the positive."""
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim not in (1, 2) or s.shape[-1] == 0:
        raise ValueError(f"scores must have shape [C] or [B, C] with C >= 1, got {s.shape}")
    if not -s.shape[-1] <= pos_index < s.shape[-1]:
        raise ValueError(f"pos_index {pos_index} is out of range for {s.shape[-1]} candidates")
    if np.isnan(s).any():
        raise ValueError("scores must not contain NaN")
    pos = np.take(s, [pos_index], axis=-1)
    return (s >= pos).sum(axis=-1).astype(np.int64)  # counts the positive itself, hence 1-based


def _ranks(ranks: np.ndarray) -> np.ndarray:
    r = np.asarray(ranks).reshape(-1)
    if r.size == 0:
        raise ValueError("ranks must not be empty")
    if (r < 1).any():
        raise ValueError(f"ranks are 1-based, got {r[r < 1][0]}")
    return r.astype(np.float64)


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def hit_rate_at_k(ranks: np.ndarray, k: int) -> float:
    """Fraction of ranks <= k."""
    _check_k(k)
    return float(np.mean(_ranks(ranks) <= k))


def ndcg_at_k(ranks: np.ndarray, k: int) -> float:
    """Mean of 1 / log2(rank + 1) over ranks <= k (0 beyond k); one relevant item per user."""
    _check_k(k)
    r = _ranks(ranks)
    return float(np.mean(np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)))


def mrr(ranks: np.ndarray) -> float:
    """Mean reciprocal rank."""
    return float(np.mean(1.0 / _ranks(ranks)))


def auc_from_scores(pos_scores: np.ndarray, neg_scores: np.ndarray) -> float:
    """pos [B], neg [B, N] (or a scalar and [N]): per user, the fraction of negatives scored below the
    positive (ties count half), averaged over users."""
    pos = np.asarray(pos_scores, dtype=np.float64).reshape(-1)
    neg = np.asarray(neg_scores, dtype=np.float64)
    neg = neg.reshape(1, -1) if neg.ndim == 1 else neg
    if neg.ndim != 2 or neg.shape[0] != pos.shape[0] or neg.shape[1] == 0 or pos.size == 0:
        raise ValueError(f"expected pos [B] and neg [B, N>=1], got {pos.shape} and {neg.shape}")
    if np.isnan(pos).any() or np.isnan(neg).any():
        raise ValueError("scores must not contain NaN")
    p = pos[:, None]
    per_user = ((neg < p).sum(axis=1) + 0.5 * (neg == p).sum(axis=1)) / neg.shape[1]
    return float(per_user.mean())
