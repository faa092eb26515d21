"""Training batches for `model.batch_forward.BatchForward` (numpy only).

A row is one user's training window (the most recent events of their training sequence) laid out as the
serving graphs lay out a history (`train.feeds.prefix_inputs`), followed by `num_cuts` candidate tokens
(M-FALCON). Two kinds of supervision:
- every history token predicts the item of the next token (`next_ids`, 0 = no target), scored against its
  own `num_negatives` uniform items (sampled softmax, as the HSTU reference), drawn from a pool of
  `negative_pool` uniform items of the row (`neg_ids`; `neg_weight` says how often each token drew each of
  them, `train.negatives`);
- `num_cuts` candidate tokens (M-FALCON) per row, each cut after a random event t - 1 of the window: the
  candidate is event t's item and sees only the events before it; event t's "high rating" label trains the
  second task on it (the engage score is the next-item prediction of the history's last token).
Rows are grouped by length bucket so a batch pads to its bucket, and every batch has the same number of
rows (short batches are filled with empty rows that carry no loss).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model.batch_index import RabIndex
from mindspore_relaygr.model.inputs import History, bucket_for, split_timestamps
from mindspore_relaygr.train.feeds import prefix_inputs
from mindspore_relaygr.train.negatives import negative_weights, weight_dtype

# Names of the arrays of a batch, in the order the loss cell takes them.
FORWARD_FIELDS = ("item_ids", "action_ids", "pos", "user_feats", "user_row", "valid", "hist_idx", "cand_idx")
TARGET_FIELDS = ("next_ids", "neg_ids", "neg_weight", "group_valid", "high_rating")


@dataclass(frozen=True)
class BatchShape:
    """Static sizes of a training batch (besides the history bucket)."""

    batch_size: int
    num_negatives: int  # sampled softmax negatives per history token
    num_cuts: int  # candidate tokens per row, each at its own cut
    negative_pool: int = 0  # uniform items per row the tokens' negatives are picked from; 0: num_negatives
    len_buckets: tuple[int, ...] | None = None  # token buckets rows are padded to; None: model.len_buckets

    def __post_init__(self) -> None:
        if self.negative_pool and self.negative_pool < self.num_negatives:
            raise ValueError(f"negative pool {self.negative_pool} is smaller than {self.num_negatives} negatives")

    @property
    def pool_size(self) -> int:
        return self.negative_pool or self.num_negatives

    @property
    def group_size(self) -> int:
        """Candidates per cut: the positive (the engage score needs no candidate negatives)."""
        return 1

    @property
    def num_candidates(self) -> int:
        return self.num_cuts * self.group_size


def history_bucket(cfg: ModelConfig, num_events: int, buckets: Sequence[int] | None = None) -> int:
    """Token bucket of a window of `num_events` events (user token included): the smallest of `buckets`
    (None: model.len_buckets) that holds it."""
    return bucket_for(num_events + (1 if cfg.has_user_token else 0), buckets or cfg.len_buckets, "history")


def history_index(rab: RabIndex, pos: np.ndarray, times: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Bias indices [n, n] of the history tokens over each other: causal, valid keys only."""
    return rab(pos, times, pos, times, valid[None, :] & (pos[None, :] <= pos[:, None]))


def empty_row(cfg: ModelConfig, bucket: int, shape: BatchShape) -> dict[str, np.ndarray]:
    """A row with no valid token and no loss (fills short batches)."""
    t = bucket + shape.num_candidates
    num_feats = max(1, len(cfg.user_feature_sizes))
    zeros_i = np.zeros(t, np.int32)
    mask = cfg.num_pos_buckets * cfg.num_time_buckets
    return {"item_ids": zeros_i, "action_ids": zeros_i, "pos": zeros_i, "user_feats": np.zeros(num_feats, np.int32),
            "user_row": np.zeros(t, np.float32), "valid": np.zeros(t, bool),
            "hist_idx": np.full((bucket, bucket), mask, np.int32),
            "cand_idx": np.full((shape.num_cuts, bucket), mask, np.int32),
            "next_ids": zeros_i, "neg_ids": np.ones(shape.pool_size, np.int32),
            "neg_weight": np.zeros((bucket, shape.pool_size), weight_dtype(shape.num_negatives)),
            "group_valid": np.zeros(shape.num_cuts, np.float32), "high_rating": np.zeros(shape.num_cuts, np.float32)}


def build_row(cfg: ModelConfig, events: History, bucket: int, shape: BatchShape, num_items: int,
              rng: np.random.Generator, rab: RabIndex) -> dict[str, np.ndarray]:
    """One row: the window's tokens, their bias indices, next-item targets, negatives and candidate tokens."""
    items, actions, feats, user_row, pos, hi, lo, valid = prefix_inputs(cfg, events, bucket)
    n_tok = int(valid.sum())
    times = np.stack([hi, lo], axis=-1)
    next_ids = np.zeros(bucket, np.int32)
    next_ids[: n_tok - 1] = items[1:n_tok]  # token i predicts token i + 1 (the user token predicts event 0)
    cand = _candidate_groups(cfg, events, shape, num_items, rng)
    neg_ids = rng.integers(1, num_items + 1, shape.pool_size).astype(np.int32)
    pick = rng.integers(0, shape.pool_size, (bucket, shape.num_negatives))
    # Candidates of a group share their query (position, time): one bias row per group.
    rows = rab(cand["pos"], cand["times"], pos, times, valid[None, :] & (pos[None, :] < cand["pos"][:, None]))
    return {
        "item_ids": np.concatenate([items, cand["item_ids"]]),
        "action_ids": np.concatenate([actions, np.full(shape.num_candidates, cfg.num_actions + 1, np.int32)]),
        "pos": np.concatenate([pos, np.repeat(cand["pos"], shape.group_size)]).astype(np.int32),
        "user_feats": feats,
        "user_row": np.concatenate([user_row, np.zeros(shape.num_candidates, np.float32)]),
        "valid": np.concatenate([valid, np.repeat(cand["group_valid"] > 0, shape.group_size)]),
        "hist_idx": history_index(rab, pos, times, valid),
        "cand_idx": rows,
        "next_ids": np.concatenate([next_ids, np.zeros(shape.num_candidates, np.int32)]),
        "neg_ids": neg_ids,
        "neg_weight": negative_weights(pick, next_ids, neg_ids),
        "group_valid": cand["group_valid"],
        "high_rating": cand["high_rating"],
        "cut_events": cand["pos"] - (1 if cfg.has_user_token else 0),  # history events before each group
    }


def _candidate_groups(cfg: ModelConfig, events: History, shape: BatchShape, num_items: int,
                      rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per group: candidate ids [G * S] (positive first), query position and time [G] / [G, 2], labels [G]."""
    g, s, user = shape.num_cuts, shape.group_size, 1 if cfg.has_user_token else 0
    out = {"item_ids": np.ones((g, s), np.int32), "pos": np.zeros(g, np.int32), "times": np.zeros((g, 2), np.float32),
           "group_valid": np.zeros(g, np.float32), "high_rating": np.zeros(g, np.float32)}
    n = len(events)
    if n >= 2:
        cuts = rng.integers(1, n, size=g)  # history = events [0, t), positive = event t
        out["item_ids"][:, 0] = events.item_ids[cuts]
        out["pos"][:] = cuts + user  # the position right after event t - 1, as rank_full places candidates
        out["times"][:] = split_timestamps(events.timestamps[cuts - 1])
        out["group_valid"][:] = 1.0
        if events.labels is not None:  # the second task's label of the positive (a one-task model has none)
            out["high_rating"][:] = events.labels[cuts]
    out["item_ids"] = out["item_ids"].reshape(-1)
    return out


def stack_rows(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.stack([r[k] for r in rows]) for k in (*FORWARD_FIELDS, *TARGET_FIELDS)}


def plan_batches(windows: Mapping[int, History], cfg: ModelConfig, batch_size: int,
                 rng: np.random.Generator, buckets: Sequence[int] | None = None) -> list[tuple[int, list[int]]]:
    """(bucket, user ids) of every batch of an epoch: users grouped by bucket (`buckets`, None:
    model.len_buckets), shuffled, in shuffled batches."""
    by_bucket: dict[int, list[int]] = {}
    for uid, events in windows.items():
        if len(events) >= 2:
            by_bucket.setdefault(history_bucket(cfg, len(events), buckets), []).append(uid)
    plan = []
    for bucket in sorted(by_bucket):
        users = [by_bucket[bucket][i] for i in rng.permutation(len(by_bucket[bucket]))]
        plan += [(bucket, users[i:i + batch_size]) for i in range(0, len(users), batch_size)]
    return [plan[i] for i in rng.permutation(len(plan))]


@dataclass(frozen=True)
class Shard:
    """This worker's part of every global batch in data-parallel training: rows [rank * b, (rank + 1) * b)
    of each batch, b = batch_size / size."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"shard rank {self.rank} is outside [0, {self.size})")


def iter_batches(windows: Mapping[int, History], cfg: ModelConfig, shape: BatchShape, num_items: int,
                 rng: np.random.Generator, row_seed: Sequence[int] = (0,), shard: Shard | None = None
                 ) -> Iterator[tuple[int, int, dict[str, np.ndarray]]]:
    """One epoch of (bucket, real rows, batch arrays) of this shard; every batch has batch_size / shard.size
    rows. `rng` orders the batches (every worker draws the same plan); each row's cuts and negatives come from
    its own generator seeded by (row_seed, user id), so a row is the same whichever worker builds it."""
    shard = shard or Shard()
    if shape.batch_size % shard.size:
        raise ValueError(f"batch size {shape.batch_size} is not a multiple of the {shard.size} workers")
    local = shape.batch_size // shard.size
    rab = RabIndex(cfg)
    for bucket, users in plan_batches(windows, cfg, shape.batch_size, rng, shape.len_buckets):
        mine = users[shard.rank * local:(shard.rank + 1) * local]
        rows = [build_row(cfg, windows[u], bucket, shape, num_items, np.random.default_rng([*row_seed, u]), rab)
                for u in mine]
        rows += [empty_row(cfg, bucket, shape)] * (local - len(rows))
        yield bucket, len(mine), stack_rows(rows)


def ranking_row(cfg: ModelConfig, history: History, bucket: int, candidate_ids: np.ndarray,
                rab: RabIndex) -> dict[str, np.ndarray]:
    """The forward inputs of one request scored as `rank_full` scores it: the history, then every candidate
    in one group placed right after the last event."""
    items, actions, feats, user_row, pos, hi, lo, valid = prefix_inputs(cfg, history, bucket)
    n_tok, c = int(valid.sum()), len(candidate_ids)
    times = np.stack([hi, lo], axis=-1)
    last = history.timestamps[-1:] if len(history) else np.zeros(1, np.int64)
    query_pos = np.array([n_tok], np.int32)
    return {
        "item_ids": np.concatenate([items, candidate_ids]).astype(np.int32),
        "action_ids": np.concatenate([actions, np.full(c, cfg.num_actions + 1, np.int32)]),
        "pos": np.concatenate([pos, np.full(c, n_tok, np.int32)]),
        "user_feats": feats,
        "user_row": np.concatenate([user_row, np.zeros(c, np.float32)]),
        "valid": np.concatenate([valid, np.ones(c, bool)]),
        "hist_idx": history_index(rab, pos, times, valid),
        "cand_idx": rab(query_pos, split_timestamps(last), pos, times, valid[None, :]),
    }
