"""Per-user chronological sequences, leave-one-out split, negative sampling, examples and a popularity baseline.

Sequences are `History` objects (oldest event first) of an event log (`data.events.Interactions`): item ids,
action ids (the event types), timestamps, the user's features, and the second task's label of each event when the
log has one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from mindspore_relaygr.data.events import Interactions
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.model.inputs import History

logger = logging.getLogger(__name__)


def build_sequences(data: Interactions, with_user_features: bool = True,
                    tie_seed: int | None = None) -> dict[int, History]:
    """Dense user id -> chronological History; events with equal timestamps keep their file order, or with
    `tie_seed` a random order drawn from it (the same for every run with that seed)."""
    ties = np.arange(len(data)) if tie_seed is None else np.random.default_rng(tie_seed).permutation(len(data))
    order = np.lexsort((ties, data.timestamps, data.user_ids))  # last key is primary
    users = data.user_ids[order]
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    ends = np.r_[starts[1:], len(users)]
    sequences = {}
    for s, e in zip(starts, ends, strict=True):
        idx = order[s:e]
        uid = int(users[s])
        feats = data.user_feature_array(uid) if with_user_features else None
        sequences[uid] = History(data.item_ids[idx].astype(np.int32), data.action_ids[idx].astype(np.int32),
                                 data.timestamps[idx].astype(np.int64), feats,
                                 None if data.labels is None else data.labels[idx])
    return sequences


def cap_history(history: History, max_len: int) -> History:
    """The most recent `max_len` events (user features kept)."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    return history.slice(max(0, len(history) - max_len))


@dataclass(frozen=True)
class Target:
    """One held-out event and the history strictly before it."""

    history: History
    item_id: int
    action_id: int
    timestamp: int


@dataclass(frozen=True)
class Split:
    """Leave-one-out split. Users with fewer than `min_events` events are only in `train` and `full`."""

    train: dict[int, History]  # events before the validation target
    valid: dict[int, Target]  # second-to-last event; history = train
    test: dict[int, Target]  # last event; history = train + validation event
    full: dict[int, History]  # every event: negatives avoid the user's whole history


def _target(seq: History, index: int) -> Target:
    return Target(seq.slice(0, index), int(seq.item_ids[index]), int(seq.action_ids[index]),
                  int(seq.timestamps[index]))


def leave_one_out(sequences: Mapping[int, History], min_events: int = 3) -> Split:
    """Test target = last event, validation target = second to last, training = everything before.

    "Last" is in build_sequences order: among equal timestamps, the one later in the file."""
    if min_events < 3:
        raise ValueError(f"min_events must be >= 3 (train, validation, test), got {min_events}")
    train, valid, test = {}, {}, {}
    for uid in sorted(sequences):
        seq = sequences[uid]
        if len(seq) < min_events:
            train[uid] = seq
            continue
        n = len(seq)
        train[uid] = seq.slice(0, n - 2)
        valid[uid] = _target(seq, n - 2)
        test[uid] = _target(seq, n - 1)
    logger.info("leave-one-out: %d users evaluated, %d train-only", len(test), len(train) - len(test))
    return Split(train, valid, test, dict(sequences))


def sample_negatives(rng: np.random.Generator, num_items: int, exclude: set[int] | np.ndarray,
                     k: int) -> np.ndarray:
    """k distinct item ids, uniform over 1..num_items minus `exclude`, in random order (int32 [k])."""
    ex = np.unique(np.fromiter(exclude, np.int64) if isinstance(exclude, set | frozenset) else np.asarray(exclude))
    ex = ex[(ex >= 1) & (ex <= num_items)]
    available = num_items - len(ex)
    if k < 0 or k > available:
        raise ValueError(f"cannot sample {k} negatives: {available} of {num_items} items are not excluded")
    if 2 * k >= available:  # dense case: draw from the explicit pool
        pool = np.setdiff1d(np.arange(1, num_items + 1), ex, assume_unique=True)
        return rng.choice(pool, size=k, replace=False).astype(np.int32)
    seen = set(ex.tolist())
    out: list[int] = []
    while len(out) < k:  # rejection sampling; each round accepts at least half in expectation
        for item in rng.integers(1, num_items + 1, size=2 * (k - len(out))).tolist():
            if item not in seen:
                seen.add(item)
                out.append(item)
                if len(out) == k:
                    break
    return np.asarray(out, dtype=np.int32)


@dataclass(frozen=True)
class EvalExample:
    """One user's ranking task: the target among sampled negatives."""

    user_id: int
    history: History  # events before the target
    target_id: int
    negative_ids: np.ndarray  # int32 [num_negatives], never in the user's full history
    earlier_items: np.ndarray  # item ids of every event before the target (uncapped): what a filter reads

    @property
    def candidate_ids(self) -> np.ndarray:
        """int32 [1 + num_negatives], the target first (score index 0 is the positive)."""
        return np.concatenate([[self.target_id], self.negative_ids]).astype(np.int32)


def build_eval_set(split: Split, which: str, num_items: int, rng: np.random.Generator,
                   num_negatives: int = 100, max_len: int | None = None) -> list[EvalExample]:
    """Per evaluated user (ascending id): history before the `which` ("valid"|"test") target, negatives."""
    if which not in ("valid", "test"):
        raise ValueError(f"which must be 'valid' or 'test', got {which!r}")
    targets = split.valid if which == "valid" else split.test
    examples = []
    for uid in sorted(targets):
        t = targets[uid]
        seen = np.unique(split.full[uid].item_ids)
        if num_items - len(seen) < num_negatives:
            raise ConfigError(f"data.num_eval_negatives={num_negatives}: user {uid} (dense id) has seen {len(seen)} of "
                              f"the {num_items} items, which leaves {num_items - len(seen)} to sample negatives from: "
                              f"lower data.num_eval_negatives")
        negs = sample_negatives(rng, num_items, seen, num_negatives)
        hist = t.history if max_len is None else cap_history(t.history, max_len)
        examples.append(EvalExample(uid, hist, t.item_id, negs, t.history.item_ids))
    return examples


class PopularityModel:
    """Baseline: an item's score is how often it occurs in the training sequences."""

    def __init__(self) -> None:
        self.counts = np.zeros(1, dtype=np.float64)

    def fit(self, sequences: Mapping[int, History] | Iterable[History]) -> PopularityModel:
        seqs = sequences.values() if isinstance(sequences, Mapping) else sequences
        items = [s.item_ids for s in seqs]
        flat = np.concatenate(items) if items else np.zeros(0, np.int64)
        self.counts = np.bincount(flat, minlength=1).astype(np.float64)
        return self

    def score(self, candidate_ids: np.ndarray) -> np.ndarray:
        """float64 scores of the same shape as candidate_ids; unseen items score 0."""
        ids = np.asarray(candidate_ids, dtype=np.int64)
        inside = (ids >= 0) & (ids < len(self.counts))
        return np.where(inside, self.counts[np.clip(ids, 0, len(self.counts) - 1)], 0.0)
