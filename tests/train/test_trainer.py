"""Training: cuts and targets (numpy), a tiny run lowers the loss and writes its outputs, seeded runs repeat."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.config import ConfigError
from mindspore_relaygr.data.movielens import load_movielens
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.dataset import check_compatible, prepare_data
from mindspore_relaygr.train.trainer import Cut, cut_targets, iter_cuts
from tests.conftest import CONFIGS


def _seq(n: int) -> History:
    return History(np.arange(1, n + 1, dtype=np.int32), (np.arange(n) % 5).astype(np.int32),
                   np.arange(n, dtype=np.int64) * 100)


def test_cuts_take_the_next_events_as_positives_and_never_leak():
    train = {1: _seq(30), 2: _seq(2), 3: _seq(1)}
    rng = np.random.default_rng(0)
    cuts = list(iter_cuts(train, 100, rng, num_negatives=10, num_positives=3, max_len=8, examples_per_user=20))
    assert {c.user_id for c in cuts} == {1, 2}  # a one-event sequence has nothing to predict
    for c in cuts:
        seq = train[c.user_id]
        t = int(c.positive_ids[0]) - 1  # items are 1..n in order, so the item id gives the cut point
        assert len(c.history) == min(t, 8) and c.history.item_ids[-1] == t
        assert c.history.timestamps.max() < seq.timestamps[t]  # no future event in the history
        np.testing.assert_array_equal(c.positive_ids, seq.item_ids[t:t + 3])
        np.testing.assert_array_equal(c.high_rating, (seq.action_ids[t:t + 3] >= 3).astype(np.float32))
        assert len(c.negative_ids) == 10 and not set(c.negative_ids) & set(seq.item_ids.tolist())


def test_cut_targets_weigh_positives_negatives_and_padding():
    cut = Cut(1, _seq(3), np.array([4, 5], np.int32), np.array([1.0, 0.0], np.float32),
              np.array([50, 51, 52, 53], np.int32))
    labels, weights = cut_targets(cut, num_tasks=2, bucket=8, high_rating_weight=0.5)
    np.testing.assert_array_equal(labels[:, 0], [1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(weights[:, 0], [0.5, 0.5, 0.25, 0.25, 0.25, 0.25, 0, 0])
    np.testing.assert_array_equal(labels[:, 1], [1, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(weights[:, 1], [0.25, 0.25, 0, 0, 0, 0, 0, 0])  # positives only


def test_data_must_fit_the_model(synthetic_data_path, tmp_path):
    data = load_movielens(synthetic_data_path)
    cfg = load_config(CONFIGS / "tiny.yaml", ["model.num_items=10", "model.num_actions=5"])
    with pytest.raises(ConfigError, match="model.num_items=10: the data has 60 items"):
        check_compatible(cfg, data)
    with pytest.raises(ConfigError, match="model.num_actions=4"):
        check_compatible(load_config(CONFIGS / "tiny.yaml", ["model.num_items=60"]), data)
    with pytest.raises(ConfigError, match=r"model.user_feature_sizes=\[3, 5\]: the data has user features"):
        check_compatible(load_config(CONFIGS / "tiny.yaml", ["model.num_items=60", "model.num_actions=5"]), data)


def test_eval_sets_are_fixed_by_the_eval_seed(synthetic_config):
    data = prepare_data(synthetic_config)
    a, b = data.eval_set("valid"), prepare_data(synthetic_config).eval_set("valid")
    assert [e.candidate_ids.tolist() for e in a] == [e.candidate_ids.tolist() for e in b]
    assert [e.candidate_ids.tolist() for e in data.eval_set("valid", 5)] == [e.candidate_ids.tolist() for e in a[:5]]
    for e in data.eval_set("test"):  # the test history ends with the validation event
        assert e.history.item_ids[-1] == data.split.valid[e.user_id].item_id


@pytest.mark.slow
def test_tiny_training_lowers_the_loss_and_writes_outputs(trained_run, synthetic_config):
    losses = np.asarray(trained_run.losses)
    assert len(losses) > 150
    first, last = losses[:40].mean(), losses[-40:].mean()
    assert last < 0.7 * first, (first, last)
    out = trained_run.output_dir
    assert (out / "best.ckpt").is_file()
    assert load_config(out / "config.yaml") == synthetic_config
    report = json.loads((out / "train_metrics.json").read_text())
    assert [e["epoch"] for e in report["evals"]] == [3, 6]
    assert report["best"]["valid_ndcg@10"] == max(e["valid_ndcg@10"] for e in report["evals"])
    assert report["best"]["valid_hr@10"] > 0.8  # the item walk is learnable; random ranking gives ~0.48


@pytest.mark.slow
def test_seeded_runs_repeat(synthetic_config, tmp_path):
    from mindspore_relaygr.train.trainer import train

    cfg = load_config(CONFIGS / "tiny.yaml", [*_overrides(synthetic_config), "train.epochs=1",
                                              f"train.output_dir={tmp_path / 'a'}"])
    first = train(cfg).losses
    cfg_b = load_config(CONFIGS / "tiny.yaml", [*_overrides(synthetic_config), "train.epochs=1",
                                                f"train.output_dir={tmp_path / 'b'}"])
    assert train(cfg_b).losses == first


def _overrides(cfg) -> list[str]:
    """The synthetic config's non-default settings as overrides (tiny.yaml is the base)."""
    from tests.train.conftest import synthetic_overrides

    return synthetic_overrides(cfg.data.path, cfg.train.output_dir)
