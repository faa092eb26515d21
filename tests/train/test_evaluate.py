"""Evaluation: metrics from score matrices, full vs relay path (identical), baselines, the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr.data.sequences import PopularityModel
from mindspore_relaygr.train.baselines import left_pad
from mindspore_relaygr.train.evaluate import format_table, ranking_metrics, relay_split, score_popularity


def test_ranking_metrics_by_hand():
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8]])  # positive (column 0) ranks 1 and 3
    m = ranking_metrics(scores)
    assert m["hr@10"] == 1.0
    assert m["ndcg@10"] == pytest.approx((1.0 + 1.0 / np.log2(4)) / 2)
    assert m["mrr"] == pytest.approx((1.0 + 1.0 / 3) / 2)
    assert m["auc"] == pytest.approx(0.5)


def test_relay_split_keeps_at_least_one_prefix_event():
    assert [relay_split(n, 8) for n in (1, 5, 9, 100)] == [1, 1, 1, 92]
    assert relay_split(10, 0) == 10


def test_left_pad():
    np.testing.assert_array_equal(left_pad(np.array([5, 6, 7]), 5), [0, 0, 5, 6, 7])
    np.testing.assert_array_equal(left_pad(np.array([5, 6, 7]), 2), [6, 7])


def test_popularity_scores_follow_training_counts(synthetic_config):
    from mindspore_relaygr.train.dataset import prepare_data

    data = prepare_data(synthetic_config)
    pop = PopularityModel().fit(data.split.train)
    examples = data.eval_set("test")
    scores = score_popularity(pop, examples)
    assert scores.shape == (len(examples), 21)
    counts = np.bincount(np.concatenate([h.item_ids for h in data.split.train.values()]), minlength=61)
    np.testing.assert_array_equal(scores[0], counts[examples[0].candidate_ids])


@pytest.mark.slow
@pytest.mark.parametrize("suffix_len", [0, 3, 16])
def test_full_and_relay_paths_give_identical_metrics(trained_run, synthetic_config, suffix_len):
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.evaluate import score_full, score_relay

    model = _trained_model(trained_run, synthetic_config)
    assert isinstance(model, RelayGRModel)
    examples = prepare_data(synthetic_config).eval_set("test")
    full, relay = score_full(model, examples), score_relay(model, examples, suffix_len)
    assert np.abs(full - relay).max() <= 1e-5
    assert ranking_metrics(full) == ranking_metrics(relay)


_MODELS = {}


def _trained_model(run, cfg):
    """One model per process with the trained weights (graphs compile once per shape)."""
    from mindspore_relaygr.model.ranker import RelayGRModel

    if "model" not in _MODELS:
        _MODELS["model"] = RelayGRModel(cfg)
        _MODELS["model"].load_checkpoint(run.checkpoint)
    return _MODELS["model"]


@pytest.mark.slow
def test_run_evaluation_report(trained_run, synthetic_config, tmp_path):
    from mindspore_relaygr.train.evaluate import run_evaluation, write_report

    report = run_evaluation(synthetic_config, trained_run.checkpoint, "test", suffix_len=4)
    rows = report["rows"]
    assert list(rows) == ["ours (full path)", "ours (relay path, suffix 4)", "popularity", "SASRec-style"]
    assert report["identical_metrics"] and report["max_abs_diff_full_vs_relay"] <= 1e-5
    assert all(row["users"] == report["users"] == 40 for row in rows.values())
    # The synthetic users walk the item ids: both sequence models must beat popularity by far.
    assert rows["ours (full path)"]["hr@10"] > rows["popularity"]["hr@10"] + 0.2
    assert rows["SASRec-style"]["hr@10"] > rows["popularity"]["hr@10"] + 0.2
    write_report(report, tmp_path / "eval.json")
    assert json.loads((tmp_path / "eval.json").read_text())["rows"].keys() == rows.keys()
    table = format_table(report)
    assert "SASRec-style" in table and "metrics identical: True" in table
