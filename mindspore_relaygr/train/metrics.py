"""Ranking metrics for one positive among sampled negatives or among all items (numpy only).

Ranks are 1-based. `rank_of_positive` and `full_ranking_ranks` break ties pessimistically: every other
candidate whose score equals the positive's ranks above it, so a constant scorer gets the worst rank
instead of rank 1. `full_ranking_ranks` is the full-ranking protocol: the target among every item id the
user has not interacted with (the history removed from the ranking).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def full_ranking_ranks(scores: np.ndarray, target_ids: np.ndarray, exclude_ids: Sequence[np.ndarray]) -> np.ndarray:
    """Ranks (int64 [B], 1-based) of each row's target among all items, the row's `exclude_ids` removed.

    scores [B, V + 1] over item ids 0..V (column 0 is padding and never ranked); exclude_ids[b] holds the ids
    removed from row b's ranking (e.g. the user's history); the target itself is always ranked, even when
    listed. Rank = 1 + #ranked items j != target scoring >= the target (ties pessimistic, as rank_of_positive)."""
    s = np.asarray(scores)
    if s.ndim != 2 or s.shape[1] < 2:
        raise ValueError(f"scores must have shape [B, V + 1] with V >= 1, got {s.shape}")
    if np.isnan(s).any():
        raise ValueError("scores must not contain NaN")
    num_rows, width = s.shape
    targets = np.asarray(target_ids).reshape(-1).astype(np.int64)
    if targets.shape[0] != num_rows or len(exclude_ids) != num_rows:
        raise ValueError(f"{num_rows} score rows, {targets.shape[0]} targets and {len(exclude_ids)} exclude lists")
    bad = targets[(targets < 1) | (targets >= width)]
    if bad.size:
        raise ValueError(f"target ids must be in [1, {width - 1}], got {bad[0]}")
    lists = [np.asarray(e, dtype=np.int64).reshape(-1) for e in exclude_ids]
    cols = np.concatenate(lists) if lists else np.zeros(0, np.int64)
    bad = cols[(cols < 0) | (cols >= width)]
    if bad.size:
        raise ValueError(f"exclude ids must be in [0, {width - 1}], got {bad[0]}")
    ranked = np.ones(s.shape, dtype=bool)
    ranked[np.repeat(np.arange(num_rows), [len(e) for e in lists]), cols] = False
    ranked[:, 0] = False
    rows = np.arange(num_rows)
    ranked[rows, targets] = True
    target_scores = s[rows, targets][:, None]
    return ((s >= target_scores) & ranked).sum(axis=1).astype(np.int64)  # counts the target itself: 1-based


def ranking_metrics_at(ranks: np.ndarray, ks: Sequence[int] = (10, 50, 200)) -> dict[str, float]:
    """{"hr@k", "ndcg@k"} for every k in ks, and "mrr"."""
    out = {}
    for k in ks:
        out[f"hr@{k}"] = hit_rate_at_k(ranks, k)
        out[f"ndcg@{k}"] = ndcg_at_k(ranks, k)
    out["mrr"] = mrr(ranks)
    return out


def per_user_values(ranks: np.ndarray, metric: str) -> np.ndarray:
    """Each user's contribution to `metric` ("hr@k", "ndcg@k" or "mrr"): the metric is their mean."""
    r = _ranks(ranks)
    if metric == "mrr":
        return 1.0 / r
    name, _, k_text = metric.partition("@")
    if name not in ("hr", "ndcg") or not k_text.isdigit():
        raise ValueError(f"metric {metric!r}: expected hr@k, ndcg@k or mrr")
    k = int(k_text)
    _check_k(k)
    if name == "hr":
        return (r <= k).astype(np.float64)
    return np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)


def standard_error(values: np.ndarray) -> float:
    """Standard error of the mean of per-user values (sample standard deviation / sqrt(n); 0 for one user)."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size < 2:
        return 0.0
    return float(np.std(v, ddof=1) / np.sqrt(v.size))


def standard_errors_at(ranks: np.ndarray, ks: Sequence[int] = (10, 50, 200)) -> dict[str, float]:
    """The standard error of every metric of `ranking_metrics_at` over the same users."""
    names = [m for k in ks for m in (f"hr@{k}", f"ndcg@{k}")] + ["mrr"]
    return {m: standard_error(per_user_values(ranks, m)) for m in names}


def paired_difference(ranks_a: np.ndarray, ranks_b: np.ndarray, metric: str) -> tuple[float, float]:
    """(mean of b - a, its standard error) for two evaluations of the same users in the same order: the
    paired error of a difference, much smaller than either metric's own when the two rank alike."""
    a, b = per_user_values(ranks_a, metric), per_user_values(ranks_b, metric)
    if a.shape != b.shape:
        raise ValueError(f"paired ranks must cover the same users: {a.size} and {b.size}")
    return float(np.mean(b - a)), standard_error(b - a)
