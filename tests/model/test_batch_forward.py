"""The batched training forward computes the serving math: its candidate scores equal `rank_full`'s."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.model.batch_index import RabIndex
from mindspore_relaygr.model.inputs import History, user_offsets
from mindspore_relaygr.train.batches import BatchShape, build_row, empty_row, history_bucket, stack_rows
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow


def _history(rng: np.random.Generator, n: int, num_items: int, feats) -> History:
    times = 1_700_000_000 + np.cumsum(rng.choice([0, 5, 600, 86_400], n))
    return History(rng.integers(1, num_items + 1, n).astype(np.int32), rng.integers(0, 4, n).astype(np.int32),
                   times.astype(np.int64), feats)


@pytest.fixture(scope="module")
def tiny_model():
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.trainer import init_weights

    cfg = load_config(CONFIGS / "tiny.yaml", ["model.dropout=0.3"])
    model = RelayGRModel(cfg)
    init_weights(model.net, cfg.model.d_model, 3)  # embeddings large enough that every term matters
    model.refresh_weights()
    return cfg, model


def test_candidate_groups_match_rank_full(tiny_model):
    """Two rows, three cuts each (and one empty row): every candidate's logits equal rank_full on the history
    before its cut, so the training graph trains exactly what serving computes."""
    from mindspore import Tensor

    from mindspore_relaygr.model.batch_forward import BatchForward
    from mindspore_relaygr.model.host_dropout import dropout_noise
    from mindspore_relaygr.train.batches import FORWARD_FIELDS

    cfg, model = tiny_model
    rng = np.random.default_rng(0)
    shape = BatchShape(batch_size=3, num_negatives=4, num_cuts=3)
    feats = np.array([1, 3], np.int32)
    events = [_history(rng, 40, cfg.model.num_items, feats), _history(rng, 57, cfg.model.num_items, feats)]
    bucket = history_bucket(cfg.model, 57)
    rab = RabIndex(cfg.model)
    rows = [build_row(cfg.model, e, bucket, shape, cfg.model.num_items, rng, rab) for e in events]
    batch = stack_rows([*rows, empty_row(cfg.model, bucket, shape)])
    assert (batch["user_feats"][0] == feats + user_offsets(cfg.model)).all()

    forward = BatchForward(model.net, cfg.model.dropout)
    inputs = [Tensor(batch[k]) for k in FORWARD_FIELDS]
    hidden = forward(*inputs)  # no noise: no dropout, as validation and serving score
    np.testing.assert_array_equal(hidden.asnumpy(), forward(*inputs).asnumpy())
    # With noise (training): the same masks give the same states, other masks other states.
    shapes = forward.noise_shapes(*batch["item_ids"].shape)
    assert shapes == [(3, batch["item_ids"].shape[1], cfg.model.d_model)] * (1 + cfg.model.num_layers)
    noisy = [forward(*inputs, *(Tensor(a) for a in dropout_noise(np.random.default_rng(s), shapes))).asnumpy()
             for s in (5, 5, 6)]
    np.testing.assert_array_equal(noisy[0], noisy[1])
    assert np.abs(noisy[0] - noisy[2]).max() > 1e-3 and np.abs(noisy[0] - hidden.asnumpy()).max() > 1e-3
    from mindspore import ops

    user = 1  # the user token comes first: event i is token i + 1
    for r, ev in enumerate(events):
        for g in range(shape.num_cuts):
            cand = bucket + g  # one candidate token per cut
            ids = batch["item_ids"][r, cand:cand + 1]
            cut = int(rows[r]["cut_events"][g])
            want = model.rank_full(ev.slice(0, cut), ids, logits=True)[0]
            assert ids[0] == ev.item_ids[cut]  # the candidate is the event right after the cut
            # engage: the state of the history's last token (event cut - 1) against the candidate's embedding
            state = hidden[r, cut - 1 + user:cut + user]
            engage = model.net.engage_logits(state, ops.gather(model.net.item_table, Tensor(ids), 0)).asnumpy()
            # high rating: the head on the candidate token's own state
            high = model.net.head(hidden[r, cand:cand + 1]).asnumpy()[0]
            np.testing.assert_allclose([engage[0], high[0]], want, atol=2e-4, rtol=1e-4)


def test_next_item_targets_follow_the_tokens(tiny_model):
    cfg, _ = tiny_model
    rng = np.random.default_rng(1)
    ev = _history(rng, 10, cfg.model.num_items, np.array([1, 3], np.int32))
    shape = BatchShape(batch_size=1, num_negatives=4, num_cuts=1)
    row = build_row(cfg.model, ev, 32, shape, cfg.model.num_items, rng, RabIndex(cfg.model))
    # token 0 is the user token: it predicts event 0; event i (token i + 1) predicts event i + 1; the last none
    np.testing.assert_array_equal(row["next_ids"][:10], ev.item_ids)
    assert (row["next_ids"][10:] == 0).all()
    assert row["group_valid"].tolist() == [1.0]
    assert row["valid"][32:].all() and not row["valid"][11:32].any()
    # a candidate sees the user token and the events before its cut, nothing after
    mask = cfg.model.num_pos_buckets * cfg.model.num_time_buckets
    cut = int(row["cut_events"][0])
    assert row["cand_idx"].shape == (1, 32)
    seen = row["cand_idx"][0] != mask
    assert seen[: cut + 1].all() and not seen[cut + 1:].any()
    causal = row["hist_idx"] != mask
    np.testing.assert_array_equal(causal, np.tril(np.ones((32, 32), bool)) & (np.arange(32) < 11)[None, :])
