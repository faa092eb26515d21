"""Sequences, leave-one-out split, negative sampling, examples and the popularity baseline."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mindspore_relaygr.data.events import Interactions
from mindspore_relaygr.data.movielens import load_movielens, movielens_interactions
from mindspore_relaygr.data.sequences import (
    PopularityModel,
    build_eval_set,
    build_sequences,
    cap_history,
    leave_one_out,
    sample_negatives,
)
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.metrics import hit_rate_at_k, rank_of_positive

HAS_RECBOLE = importlib.util.find_spec("recbole") is not None


def make_interactions(rows: list[tuple[int, int, float, int]], with_features: bool = False) -> Interactions:
    """rows of (dense user, dense item, rating, timestamp), in file order; the rating r is event type r - 1 and
    the label is rating >= 4."""
    u, i, r, t = (np.asarray(c) for c in zip(*rows, strict=True))
    users, items = sorted(set(u.tolist())), sorted(set(i.tolist()))
    feats = {uid: (1, 2, uid % 22) for uid in users} if with_features else {}
    return Interactions(u.astype(np.int32), i.astype(np.int32), (r - 1).astype(np.int32), t.astype(np.int64),
                        {x: x for x in users}, {x: x for x in items}, feats, {}, "test",
                        (3, 8, 22) if with_features else (), labels=r >= 4, event_types=(1, 2, 3, 4, 5))


# user 1: events out of time order in the file, with a timestamp tie (items 30 then 10, file order);
# user 2: two events only (train-only); user 3: exactly three events.
ROWS = [(1, 30, 5, 300), (2, 7, 4, 50), (1, 20, 2, 100), (3, 1, 1, 10), (1, 10, 4, 300), (1, 40, 3, 400),
        (3, 2, 2, 20), (2, 8, 5, 60), (1, 50, 1, 200), (3, 3, 3, 30)]


@pytest.fixture
def sequences() -> dict[int, History]:
    return build_sequences(make_interactions(ROWS, with_features=True))


def test_build_sequences_chronological_and_stable(sequences: dict[int, History]) -> None:
    s1 = sequences[1]
    np.testing.assert_array_equal(s1.item_ids, [20, 50, 30, 10, 40])  # 30 before 10: same time, file order
    np.testing.assert_array_equal(s1.timestamps, [100, 200, 300, 300, 400])
    np.testing.assert_array_equal(s1.action_ids, [1, 0, 4, 3, 2])
    np.testing.assert_array_equal(s1.labels, [False, False, True, True, False])  # the events' own labels
    np.testing.assert_array_equal(s1.user_features, [1, 2, 1])
    assert s1.item_ids.dtype == np.int32 and s1.action_ids.dtype == np.int32 and s1.timestamps.dtype == np.int64
    np.testing.assert_array_equal(sequences[3].item_ids, [1, 2, 3])
    assert sorted(sequences) == [1, 2, 3]
    assert build_sequences(make_interactions(ROWS), with_user_features=False)[1].user_features is None


def test_a_tie_seed_shuffles_only_equal_timestamps() -> None:
    """Ten events in one second between two others: a seed reorders the ten (the same way every time), the
    rest stay in time order, and each event keeps its own action and label."""
    rows = [(1, 100, 1, 50)] + [(1, item, 1 + item % 5, 60) for item in range(1, 11)] + [(1, 200, 2, 70)]
    data = make_interactions(rows)
    file_order = build_sequences(data, with_user_features=False)[1]
    np.testing.assert_array_equal(file_order.item_ids, [100, *range(1, 11), 200])
    orders = []
    for seed in (1, 2, 1):
        seq = build_sequences(data, with_user_features=False, tie_seed=seed)[1]
        assert seq.item_ids[0] == 100 and seq.item_ids[-1] == 200
        assert sorted(seq.item_ids[1:-1].tolist()) == list(range(1, 11))
        np.testing.assert_array_equal(seq.timestamps, file_order.timestamps)
        np.testing.assert_array_equal(seq.action_ids[1:-1], seq.item_ids[1:-1] % 5)  # rating 1 + item % 5
        orders.append(seq.item_ids.tolist())
    assert orders[0] == orders[2] and orders[0] != orders[1] and orders[0] != file_order.item_ids.tolist()


def test_cap_history_keeps_most_recent(sequences: dict[int, History]) -> None:
    np.testing.assert_array_equal(cap_history(sequences[1], 2).item_ids, [10, 40])
    np.testing.assert_array_equal(cap_history(sequences[1], 2).timestamps, [300, 400])
    assert len(cap_history(sequences[1], 99)) == 5
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        cap_history(sequences[1], 0)


def test_leave_one_out_targets_are_last_events(sequences: dict[int, History]) -> None:
    split = leave_one_out(sequences)
    assert sorted(split.test) == sorted(split.valid) == [1, 3]
    np.testing.assert_array_equal(split.train[2].item_ids, [7, 8])  # too short: all training, never evaluated
    np.testing.assert_array_equal(split.train[1].item_ids, [20, 50, 30])
    assert (split.valid[1].item_id, split.valid[1].action_id, split.valid[1].timestamp) == (10, 3, 300)
    assert (split.test[1].item_id, split.test[1].action_id, split.test[1].timestamp) == (40, 2, 400)
    np.testing.assert_array_equal(split.valid[1].history.item_ids, [20, 50, 30])
    np.testing.assert_array_equal(split.test[1].history.item_ids, [20, 50, 30, 10])
    np.testing.assert_array_equal(split.train[3].item_ids, [1])
    assert (split.valid[3].item_id, split.test[3].item_id) == (2, 3)
    with pytest.raises(ValueError, match="min_events must be >= 3"):
        leave_one_out(sequences, min_events=2)


def _check_no_leakage(sequences: dict[int, History], split) -> None:
    for uid, seq in sequences.items():
        if uid not in split.test:
            assert len(seq) < 3 and len(split.train[uid]) == len(seq)
            continue
        test, valid, train = split.test[uid], split.valid[uid], split.train[uid]
        n = len(seq)
        assert (test.item_id, test.timestamp) == (seq.item_ids[-1], seq.timestamps[-1])
        assert (valid.item_id, valid.timestamp) == (seq.item_ids[-2], seq.timestamps[-2])
        assert len(train) == n - 2 and len(valid.history) == n - 2 and len(test.history) == n - 1
        np.testing.assert_array_equal(train.item_ids, seq.item_ids[: n - 2])
        assert train.timestamps.max() <= valid.timestamp <= test.timestamp
        assert test.history.timestamps.max() <= test.timestamp
        assert valid.history.timestamps.max() <= valid.timestamp


def test_leave_one_out_no_future_leakage(sequences: dict[int, History]) -> None:
    _check_no_leakage(sequences, leave_one_out(sequences))


def test_sample_negatives_excludes_history_and_is_deterministic() -> None:
    exclude = np.array([1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 500])  # 144, 500 out of range: ignored
    for seed in range(50):
        for k in (1, 10, 80, 90):  # 90 = every allowed item (dense path); small k = rejection path
            negs = sample_negatives(np.random.default_rng(seed), 100, exclude, k)
            assert negs.dtype == np.int32 and negs.shape == (k,)
            assert len(set(negs.tolist())) == k  # distinct
            assert not set(negs.tolist()) & set(exclude.tolist())
            assert negs.min() >= 1 and negs.max() <= 100
            np.testing.assert_array_equal(negs, sample_negatives(np.random.default_rng(seed), 100, exclude, k))
    a = sample_negatives(np.random.default_rng(0), 10_000, {1, 2}, 100)
    b = sample_negatives(np.random.default_rng(1), 10_000, {1, 2}, 100)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, sample_negatives(np.random.default_rng(0), 10_000, np.array([2, 1]), 100))
    with pytest.raises(ValueError, match="cannot sample 91 negatives: 90 of 100"):
        sample_negatives(np.random.default_rng(0), 100, exclude, 91)


@pytest.mark.parametrize("k", [1, 4])  # k=1: rejection path; k=4 of 8: dense path
def test_sample_negatives_uniform(k: int) -> None:
    rng = np.random.default_rng(0)
    counts = np.bincount(np.concatenate([sample_negatives(rng, 10, {1, 2}, k) for _ in range(4000)]), minlength=11)
    assert counts[:3].sum() == 0
    expected = 4000 * k / 8
    assert np.all(np.abs(counts[3:] - expected) < 0.1 * expected), counts


def test_eval_set(sequences: dict[int, History]) -> None:
    split = leave_one_out(sequences)
    ev = build_eval_set(split, "test", num_items=60, rng=np.random.default_rng(3), num_negatives=20, max_len=2)
    assert [e.user_id for e in ev] == [1, 3]
    e = ev[0]
    assert e.target_id == 40 and e.candidate_ids[0] == 40 and e.candidate_ids.shape == (21,)
    np.testing.assert_array_equal(e.history.item_ids, [30, 10])  # capped to the 2 most recent
    assert not set(e.negative_ids.tolist()) & set(sequences[1].item_ids.tolist())
    again = build_eval_set(split, "test", num_items=60, rng=np.random.default_rng(3), num_negatives=20, max_len=2)
    assert all(np.array_equal(x.candidate_ids, y.candidate_ids) for x, y in zip(ev, again, strict=True))
    valid = build_eval_set(split, "valid", num_items=60, rng=np.random.default_rng(3), num_negatives=20)
    assert valid[0].target_id == 10 and 40 not in valid[0].negative_ids  # the future test item is excluded too
    with pytest.raises(ValueError, match="which must be"):
        build_eval_set(split, "train", 60, np.random.default_rng(0))


def test_popularity_model() -> None:
    seqs = [History(np.array([1, 2, 2, 3, 3, 3], np.int32), np.zeros(6, np.int32), np.arange(6)),
            History(np.array([3, 4], np.int32), np.zeros(2, np.int32), np.arange(2))]
    pop = PopularityModel().fit(seqs)
    np.testing.assert_array_equal(pop.score(np.array([3, 2, 1, 4, 99, 0])), [4, 2, 1, 1, 0, 0])
    np.testing.assert_array_equal(pop.score(np.array([[3, 4], [2, 1]])).shape, (2, 2))


@pytest.mark.skipif(not HAS_RECBOLE, reason="recbole (which ships ML-100K) is not installed")
def test_ml100k_split_and_popularity_baseline() -> None:
    data = load_movielens()
    sequences = build_sequences(movielens_interactions(data))
    lengths = np.array([len(s) for s in sequences.values()])
    assert (lengths.min(), int(np.median(lengths)), lengths.max(), lengths.sum()) == (20, 65, 737, 100_000)
    split = leave_one_out(sequences)
    assert len(split.test) == len(split.valid) == 943
    _check_no_leakage(sequences, split)
    ev = build_eval_set(split, "test", data.num_items, np.random.default_rng(0))
    for e in ev:
        assert e.negative_ids.shape == (100,) and len(set(e.negative_ids.tolist())) == 100
        assert not set(e.negative_ids.tolist()) & set(sequences[e.user_id].item_ids.tolist())
    pop = PopularityModel().fit(split.train)
    ranks = rank_of_positive(np.stack([pop.score(e.candidate_ids) for e in ev]))
    assert hit_rate_at_k(ranks, 10) > 0.3  # random ranking gives ~10/101
