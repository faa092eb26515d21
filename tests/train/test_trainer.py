"""Training: cuts and targets (numpy), a tiny run lowers the loss and writes its outputs, seeded runs repeat."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.config import ConfigError
from mindspore_relaygr.data.events import load_interactions
from mindspore_relaygr.data.sequences import cap_history
from mindspore_relaygr.model.batch_index import RabIndex
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.batches import BatchShape, build_row, iter_batches
from mindspore_relaygr.train.dataset import check_compatible, prepare_data, sized_config
from tests.conftest import CONFIGS


def _seq(n: int) -> History:
    """Events of action ids 0..4 in turn, labelled 1 on the ids >= 3 (MovieLens's rating >= 4)."""
    actions = (np.arange(n) % 5).astype(np.int32)
    return History(np.arange(1, n + 1, dtype=np.int32), actions, np.arange(n, dtype=np.int64) * 100,
                   labels=actions >= 3)


SHAPE = BatchShape(batch_size=4, num_negatives=6, num_cuts=3, negative_pool=10)


def test_an_epoch_visits_every_trainable_user_once_in_full_batches():
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.user_feature_sizes=[]"]).model
    windows = {u: cap_history(_seq(n), 127) for u, n in enumerate([1, 2, 5, 40, 63, 64, 90, 127, 200, 3], 1)}
    batches = list(iter_batches(windows, cfg, SHAPE, 100, np.random.default_rng(0)))
    seen = sorted(int(b["user_row"].shape[0]) for _, _, b in batches)
    assert seen == [SHAPE.batch_size] * len(batches)  # every batch has the same number of rows
    assert sum(real for _, real, _ in batches) == 9  # user 1 (one event) has nothing to predict
    for bucket, real, b in batches:
        assert b["item_ids"].shape == (SHAPE.batch_size, bucket + SHAPE.num_candidates)
        assert b["hist_idx"].shape == (SHAPE.batch_size, bucket, bucket)
        assert b["cand_idx"].shape == (SHAPE.batch_size, SHAPE.num_cuts, bucket)
        # Every history token has its own negatives: 6 draws from the row's pool of 10 uniform items, as
        # weights over the pool (0 for a pool item equal to the token's target).
        w = b["neg_weight"]
        assert b["neg_ids"].shape == (SHAPE.batch_size, 10) and w.shape == (SHAPE.batch_size, bucket, 10)
        assert b["neg_ids"].min() >= 1 and w.min() >= 0
        targets = b["next_ids"][:, :bucket]
        hits = targets[:, :, None] == b["neg_ids"][:, None, :]
        assert (w[hits] == 0).all() and (w.sum(-1)[:real] <= 6).all()
        assert (w.sum(-1)[:real][~hits.any(-1)[:real]] == 6).all()  # a token without a hit keeps its 6 draws
        assert len({tuple(p) for p in w[0]}) > bucket // 2
        assert (b["group_valid"][real:] == 0).all() and (b["next_ids"][real:] == 0).all()  # filler rows
        lengths = b["valid"][:real, :bucket].sum(axis=1)
        assert (lengths <= bucket).all() and (lengths > (bucket // 2 if bucket > 32 else 0)).all()
    assert len(windows[9]) == 127  # a long sequence keeps its most recent events


def test_training_buckets_of_their_own_pad_less():
    """train.len_buckets: rows pad to the smallest training bucket that holds them, not model.len_buckets."""
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.user_feature_sizes=[]"]).model
    windows = {u: cap_history(_seq(n), 127) for u, n in enumerate([5, 12, 20, 40, 63, 100, 127], 1)}
    fine = BatchShape(batch_size=2, num_negatives=6, num_cuts=1, negative_pool=10, len_buckets=(16, 48, 128))
    rows = {}
    for bucket, _, b in iter_batches(windows, cfg, fine, 100, np.random.default_rng(0)):
        assert b["hist_idx"].shape == (2, bucket, bucket)
        lengths = b["valid"][:, :bucket].sum(axis=1)
        for n in lengths[lengths > 0]:
            rows[int(n)] = bucket
    assert rows == {5: 16, 12: 16, 20: 48, 40: 48, 63: 128, 100: 128, 127: 128}  # no user features: no user token
    coarse = [bucket for bucket, _, _ in iter_batches(windows, cfg, BatchShape(2, 6, 1, 10), 100,
                                                       np.random.default_rng(0))]
    assert sorted(set(coarse)) == [32, 64, 128]  # model.len_buckets


def test_negative_pool_must_hold_the_negatives():
    with pytest.raises(ValueError, match="pool 4 is smaller than 6"):
        BatchShape(batch_size=4, num_negatives=6, num_cuts=1, negative_pool=4)
    with pytest.raises(ConfigError, match="train.negative_pool=4: must be >= train.num_negatives=6"):
        load_config(CONFIGS / "tiny.yaml", ["train.num_negatives=6", "train.negative_pool=4"])


def test_candidate_groups_hold_the_event_after_their_cut():
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.user_feature_sizes=[]"]).model
    rng = np.random.default_rng(3)
    seq = _seq(30)
    for _ in range(20):
        row = build_row(cfg, seq, 32, SHAPE, 100, rng, RabIndex(cfg))
        for g, cut in enumerate(row["cut_events"]):
            group = row["item_ids"][32 + g * SHAPE.group_size: 32 + (g + 1) * SHAPE.group_size]
            assert 1 <= cut < 30 and group[0] == seq.item_ids[cut]
            assert row["high_rating"][g] == float(seq.labels[cut])  # the positive's own label
            mask = cfg.num_pos_buckets * cfg.num_time_buckets
            assert ((row["cand_idx"][g] != mask) == (np.arange(32) < cut)).all()  # no token from the cut on


def test_data_must_fit_the_model(synthetic_data_path, tmp_path):
    """A size the config sets must be the data's (a 500-item catalogue under num_items 3706 is an error, not a
    silently oversized table); null sizes come from the data."""
    schema = [f"data.path={synthetic_data_path}", "data.event_column=rating", "data.label_events=[4, 5]",
              "data.num_eval_negatives=20"]
    data = load_interactions(load_config(CONFIGS / "tiny.yaml", schema).data)
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.num_items=10", "model.num_actions=5", *schema])
    with pytest.raises(ConfigError, match="model.num_items=10: the data has 60 items"):
        check_compatible(cfg, data)
    with pytest.raises(ConfigError, match="model.num_items=3706: the data has 60 items"):
        check_compatible(load_config(CONFIGS / "tiny.yaml", ["model.num_items=3706", *schema]), data)
    with pytest.raises(ConfigError, match=r"model.num_actions=4: the data has 5 event types \(event types 1, 2"):
        check_compatible(load_config(CONFIGS / "tiny.yaml", ["model.num_items=60", *schema]), data)
    with pytest.raises(ConfigError, match=r"model.user_feature_sizes=\[3, 5\]: the data's user features \[\] have"):
        check_compatible(load_config(CONFIGS / "tiny.yaml", ["model.num_items=60", "model.num_actions=5", *schema]),
                         data)
    sized = sized_config(load_config(CONFIGS / "tiny.yaml", [*schema, "model.num_items=null", "model.num_actions=null",
                                                             "model.user_feature_sizes=null"]), data)
    assert (sized.model.num_items, sized.model.num_actions, sized.model.user_feature_sizes) == (60, 5, [])
    no_label = load_config(CONFIGS / "tiny.yaml", [f"data.path={synthetic_data_path}", "data.event_column=rating",
                                                   "data.num_eval_negatives=20",
                                                   "model.num_items=60", "model.num_actions=5",
                                                   "model.user_feature_sizes=[]"])
    with pytest.raises(ConfigError, match=r"the second task needs a label, and the data has none"):
        check_compatible(no_label, load_interactions(no_label.data))


def test_a_temperature_the_loss_cannot_take_is_refused_before_training(synthetic_config, tmp_path):
    from mindspore_relaygr.train.trainer import Trainer

    with pytest.raises(ConfigError, match="model.score_temperature=0.01: training needs >= 0.025"):
        Trainer(_cfg(synthetic_config, tmp_path, "model.score_temperature=0.01"))
    assert not any(tmp_path.iterdir())  # nothing written


def test_eval_sets_are_fixed_by_the_eval_seed(synthetic_config):
    data = prepare_data(synthetic_config)
    a, b = data.eval_set("valid"), prepare_data(synthetic_config).eval_set("valid")
    assert [e.candidate_ids.tolist() for e in a] == [e.candidate_ids.tolist() for e in b]
    assert [e.candidate_ids.tolist() for e in data.eval_set("valid", 5)] == [e.candidate_ids.tolist() for e in a[:5]]
    for e in data.eval_set("test"):  # the test history ends with the validation event
        assert e.history.item_ids[-1] == data.split.valid[e.user_id].item_id


@pytest.mark.slow
def test_tiny_training_learns_and_writes_outputs(trained_run, synthetic_config):
    losses = np.asarray(trained_run.epoch_losses)
    assert len(losses) == synthetic_config.train.epochs
    assert losses[-3:].mean() < 0.7 * losses[:3].mean(), losses
    out = trained_run.output_dir
    for name in ("best.ckpt", "last.ckpt", "train_state.json", "train_metrics.json", "train_curve.png"):
        assert (out / name).is_file()
    assert load_config(out / "config.yaml") == synthetic_config
    report = json.loads((out / "train_metrics.json").read_text())
    assert [e["epoch"] for e in report["evals"]] == [12, 24]
    assert report["best"]["valid_ndcg@10"] == max(e["valid_ndcg@10"] for e in report["evals"])
    # Full ranking of 60 items, history filtered: each user's taste group is a third of the catalogue, so a
    # ranker that learned the groups ranks the target in the top 10 mostly; a random one about 10 / 50 of the time.
    assert report["best"]["valid_hr@10"] > 0.6
    assert report["tokens_per_s"] > 0


def _cfg(synthetic_config, out, *extra: str):
    return load_config(CONFIGS / "tiny.yaml", [*_overrides(synthetic_config), f"train.output_dir={out}", *extra])


@pytest.mark.slow
def test_seeded_runs_repeat_and_resume_continues(synthetic_config, tmp_path):
    from mindspore_relaygr.train.trainer import train

    # Dropout on: its masks are drawn on the host, seeded per step (model.host_dropout).
    two = ["train.epochs=2", "train.eval_every=1", "model.dropout=0.2"]
    whole = train(_cfg(synthetic_config, tmp_path / "a", *two))
    assert train(_cfg(synthetic_config, tmp_path / "b", *two)).step_losses == whole.step_losses
    # Stopped after epoch 1 and resumed: the same two epochs.
    train(_cfg(synthetic_config, tmp_path / "c", *two[1:], "train.epochs=1"))
    resumed = train(_cfg(synthetic_config, tmp_path / "c", *two), resume=True)
    assert resumed.epoch_losses == whole.epoch_losses
    assert [e["epoch"] for e in resumed.evals] == [1, 2]
    assert resumed.tokens == whole.tokens > 0  # the rate counts the epochs before the resume too
    # A run that stopped early is finished: resuming it (with epochs left) trains nothing more.
    frozen = ["train.epochs=5", "train.eval_every=1", "train.patience=1", "train.lr=1e-12"]
    stopped = train(_cfg(synthetic_config, tmp_path / "e", *frozen))
    assert [e["epoch"] for e in stopped.evals] == [1, 2]  # no better validation at epoch 2: stopped
    again = train(_cfg(synthetic_config, tmp_path / "e", *frozen), resume=True)
    assert again.epoch_losses == stopped.epoch_losses and again.evals == stopped.evals
    assert again.tokens_per_s == stopped.tokens_per_s > 0
    # Another seed draws other masks (and order): the run differs.
    other = train(_cfg(synthetic_config, tmp_path / "d", *two, "train.seed=9"))
    assert other.step_losses != whole.step_losses


@pytest.mark.slow
def test_batched_loss_is_the_mean_of_per_sequence_losses(synthetic_config):
    """Two sequences of equal length: the loss of the batch equals the mean of each alone (the other row
    empty), so padding rows carry no loss and rows do not leak into each other."""
    from mindspore import Tensor

    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.batches import FORWARD_FIELDS, TARGET_FIELDS, empty_row, stack_rows
    from mindspore_relaygr.train.trainer import _loss_cell

    cfg = synthetic_config
    shape = BatchShape(batch_size=2, num_negatives=6, num_cuts=2)
    loss = _loss_cell(RelayGRModel(cfg).net, cfg, shape)
    loss.set_train(False)
    rng = np.random.default_rng(5)
    rab = RabIndex(cfg.model)
    rows = [build_row(cfg.model, _seq(20).slice(k, k + 12), 32, shape, 60, rng, rab) for k in (0, 5)]
    empty = empty_row(cfg.model, 32, shape)

    def value(batch_rows):
        batch = stack_rows(batch_rows)
        return float(loss(*(Tensor(batch[k]) for k in (*FORWARD_FIELDS, *TARGET_FIELDS))).asnumpy())

    both, one, two = value(rows), value([rows[0], empty]), value([empty, rows[1]])
    assert both == pytest.approx((one + two) / 2, rel=1e-5)
    assert one != pytest.approx(two)


def _overrides(cfg) -> list[str]:
    """The synthetic config's non-default settings as overrides (tiny.yaml is the base)."""
    from tests.train.conftest import synthetic_overrides

    return synthetic_overrides(cfg.data.path, cfg.train.output_dir)


@pytest.mark.parametrize("rab_mean", [0.0, 1.0])
def test_init_sets_the_relative_bias_mean(rab_mean):
    from mindspore_relaygr.model.network import HSTUNet
    from mindspore_relaygr.runtime import configure_context
    from mindspore_relaygr.train.trainer import init_weights

    cfg = load_config(CONFIGS / "tiny.yaml")
    configure_context(cfg.context)
    net = HSTUNet(cfg.model)
    init_weights(net, cfg.model.d_model, seed=0, rab_mean=rab_mean)
    table = net.rab.table.asnumpy()
    assert abs(table.mean() - rab_mean) < 0.01 and 0.01 < table.std() < 0.03
    assert abs(net.item_table.asnumpy().std() - 0.02 * np.sqrt(cfg.model.d_model)) < 0.01


def test_training_sequences_with_the_validation_event(synthetic_config):
    """train.train_on_valid trains on every event but the test target (the generative-recommenders protocol)."""
    data = prepare_data(synthetic_config)
    with_valid = data.training_sequences(include_valid=True)
    assert data.training_sequences() is data.split.train
    assert set(with_valid) == set(data.split.train)
    for uid, seq in with_valid.items():
        if uid in data.split.test:
            assert len(seq) == len(data.split.train[uid]) + 1
            assert seq.item_ids[-1] == data.split.valid[uid].item_id
            np.testing.assert_array_equal(seq.item_ids, data.split.test[uid].history.item_ids)
        else:
            assert seq is data.split.train[uid]


@pytest.mark.slow
def test_train_on_valid_runs_its_epochs_without_validation(synthetic_config, tmp_path):
    from mindspore_relaygr.train.trainer import train

    result = train(_cfg(synthetic_config, tmp_path, "train.epochs=3", "train.train_on_valid=true",
                        "train.keep_every=2"))
    assert result.evals == [] and len(result.epoch_losses) == 3
    assert result.best["epoch"] == 3 and result.checkpoint.is_file()
    # keep_every: the model after epoch 2 is kept beside the last one (a run whose epochs a holdout picks later)
    assert sorted(p.name for p in tmp_path.glob("epoch_*.ckpt")) == ["epoch_002.ckpt"]
    assert (tmp_path / "epoch_002.ckpt").read_bytes() != result.checkpoint.read_bytes()
    report = json.loads((tmp_path / "train_metrics.json").read_text())
    assert report["best"]["epoch"] == 3 and report["evals"] == []
    assert (tmp_path / "train_curve.png").is_file()
