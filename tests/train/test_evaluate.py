"""Evaluation: metrics from score matrices, full vs relay path (identical), baselines, the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr.train.baselines import left_pad
from mindspore_relaygr.train.eval_filter import parse_filter
from mindspore_relaygr.train.evaluate import format_table, protocol_rows, ranking_metrics
from mindspore_relaygr.train.full_ranking import item_chunks


def test_ranking_metrics_by_hand():
    scores = np.array([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8]])  # positive (column 0) ranks 1 and 3
    m = ranking_metrics(scores)
    assert m["hr@10"] == 1.0
    assert m["ndcg@10"] == pytest.approx((1.0 + 1.0 / np.log2(4)) / 2)
    assert m["mrr"] == pytest.approx((1.0 + 1.0 / 3) / 2)
    assert m["auc"] == pytest.approx(0.5)


def test_both_protocols_from_all_item_scores(synthetic_config):
    """The sampled protocol reads the candidates' columns of the all-item scores; the full protocol ranks
    every item but those the filter names (the reference: the 200 most recent earlier events' items, here
    every earlier item: the synthetic users have fewer events)."""
    from mindspore_relaygr.train.dataset import prepare_data

    data = prepare_data(synthetic_config)
    examples = data.eval_set("test")[:3]
    scores = np.tile(np.arange(61, dtype=np.float32), (3, 1))  # item i scores i
    scores[:, 0] = -np.inf
    rows = protocol_rows(scores, examples)
    assert list(rows["full"]) == ["recent200", "all"]
    items = np.arange(1, 61)
    ranks = [1 + np.sum((items > e.target_id) & ~np.isin(items, e.history.item_ids)) for e in examples]
    for name in ("recent200", "all"):
        assert rows["full"][name]["mrr"] == pytest.approx(np.mean(1.0 / np.array(ranks)))
        assert rows["full"][name]["users"] == 3
    assert rows["sampled"]["users"] == 3
    unfiltered = protocol_rows(scores, examples, [parse_filter("none")])["full"]["none"]
    ranks = [1 + np.sum(items > e.target_id) for e in examples]
    assert unfiltered["mrr"] == pytest.approx(np.mean(1.0 / np.array(ranks)))
    sampled = ranking_metrics(np.stack([e.candidate_ids for e in examples]).astype(np.float64))
    assert rows["sampled"]["mrr"] == pytest.approx(sampled["mrr"])


def test_path_agreement_allows_only_near_ties(synthetic_config):
    """Scores within R1 may flip a near-tie (an item within 2e-5 of the target); anything more fails."""
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.evaluate import path_agreement

    examples = prepare_data(synthetic_config).eval_set("test")[:2]
    full = np.tile(np.arange(61, dtype=np.float64) * 1e-3, (2, 1))
    full[:, 0] = -np.inf
    t = examples[0].target_id
    other = next(i for i in range(1, 61) if i != t and i not in examples[0].history.item_ids)
    full[0, other] = full[0, t] + 5e-6  # a near-tie just above the target
    relay = full.copy()
    relay[0, other] -= 9e-6  # within R1 (1e-5), now just below the target: the rank moves by one
    agreement = path_agreement(full, relay, examples)
    assert agreement["paths_agree"] and agreement["rank_differences"] == 1
    assert agreement["rank_differences_unexplained"] == 0
    relay[0, other] = full[0, other] - 4e-6  # within R1 and still above: same ranks
    assert path_agreement(full, relay, examples)["rank_differences"] == 0
    relay[0, other] = full[0, other] - 2e-5  # beyond R1: the paths disagree
    assert not path_agreement(full, relay, examples)["paths_agree"]


def test_item_chunks_cover_every_item_once():
    chunks = item_chunks(70, 32)
    assert [len(c) for c in chunks] == [32, 32, 6]
    np.testing.assert_array_equal(np.concatenate(chunks), np.arange(1, 71))


def test_left_pad():
    np.testing.assert_array_equal(left_pad(np.array([5, 6, 7]), 5), [0, 0, 5, 6, 7])
    np.testing.assert_array_equal(left_pad(np.array([5, 6, 7]), 2), [6, 7])


@pytest.mark.slow
@pytest.mark.parametrize("suffix_len", [0, 3, 16])
def test_full_and_relay_paths_score_every_item_alike(trained_run, synthetic_config, suffix_len):
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.full_ranking import full_path_logits, relay_path_logits

    model = _trained_model(trained_run, synthetic_config)
    chunks = item_chunks(60, synthetic_config.model.max_candidates)
    for e in prepare_data(synthetic_config).eval_set("test")[:8]:
        full, relay = full_path_logits(model, e.history, chunks), relay_path_logits(model, e.history, chunks,
                                                                                    suffix_len)
        assert np.isneginf(full[0]) and np.isfinite(full[1:]).all()
        np.testing.assert_allclose(relay, full, atol=1e-4)


@pytest.mark.slow
def test_batched_scorer_ranks_as_rank_full(trained_run, synthetic_config):
    from mindspore_relaygr.train.dataset import prepare_data
    from mindspore_relaygr.train.evaluate import score_all_items
    from mindspore_relaygr.train.full_ranking import BatchedScorer, batch_ranks, full_path_logits, ranking_cases

    model = _trained_model(trained_run, synthetic_config)
    data = prepare_data(synthetic_config)
    cases = ranking_cases(data.split.valid, data.max_history_len)
    chunks = item_chunks(60, synthetic_config.model.max_candidates)
    scores = score_all_items(lambda h: full_path_logits(model, h, chunks), cases)
    scorer = BatchedScorer(model.net, synthetic_config.model, 60, batch_size=7)
    got = scorer.ranks_by_filter(cases, [parse_filter("recent2"), parse_filter("none")])
    for name in ("recent2", "none"):
        np.testing.assert_array_equal(got[name], batch_ranks(scores, cases, parse_filter(name)))
    np.testing.assert_array_equal(scorer.ranks(cases), batch_ranks(scores, cases, parse_filter("recent200")))


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
    assert list(rows) == ["ours (full path)", "ours (relay path, suffix 4)", "popularity", "SASRec"]
    assert report["paths_agree"] and report["max_abs_diff_full_vs_relay"] <= 1e-5
    assert list(report["filters"]) == ["recent200", "all"] and "200 most recent" in report["filters"]["recent200"]
    for row in rows.values():
        assert row["full"]["recent200"]["users"] == row["sampled"]["users"] == report["users"] == 40
        se = row["full"]["recent200"]["se"]["hr@10"]
        hr = row["full"]["recent200"]["hr@10"]
        assert se == pytest.approx(np.sqrt(hr * (1 - hr) / 39))  # a hit rate's standard error (n - 1)
    # Users keep to one third of the catalogue: both sequence models must beat popularity by far.
    ours, sasrec, popular = (rows[k]["full"]["recent200"] for k in ("ours (full path)", "SASRec", "popularity"))
    assert ours["hr@10"] > popular["hr@10"] + 0.2 and sasrec["hr@10"] > popular["hr@10"] + 0.2
    write_report(report, tmp_path / "eval.json")
    saved = json.loads((tmp_path / "eval.json").read_text())
    assert saved["rows"].keys() == rows.keys() and saved["filters"] == report["filters"]
    table = format_table(report)
    assert "SASRec" in table and "paths agree: True" in table and "hr@200" in table
    assert "filter recent200" in table and "filter all" in table
