"""`relaygr caps`: one trained model ranked with its histories cut to each cap."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.cap_curve import check_caps, quality_vs_cap
from mindspore_relaygr.train.dataset import prepare_data
from mindspore_relaygr.train.full_ranking import full_path_logits, item_chunks
from mindspore_relaygr.train.metrics import full_ranking_ranks, ranking_metrics_at


def test_caps_must_fit_the_model():
    assert check_caps([8, 2, 8], longest=10) == [2, 8]
    with pytest.raises(ConfigError, match="1..10"):
        check_caps([2, 11], longest=10)
    with pytest.raises(ConfigError):
        check_caps([], longest=10)


def test_each_cap_ranks_like_rank_full_on_the_cut_history(synthetic_config, trained_run):
    from mindspore_relaygr.model.ranker import RelayGRModel

    report = quality_vs_cap(synthetic_config, trained_run.checkpoint, [3, 6], progress=lambda m: None)
    data = prepare_data(synthetic_config)
    model = RelayGRModel(synthetic_config)
    model.load_checkpoint(str(trained_run.checkpoint))
    chunks = item_chunks(data.num_items, max(synthetic_config.model.candidate_buckets))
    for row in report["rows"]:
        cap = row["cap"]
        users = sorted(data.split.test)
        cut = [data.split.test[u].history.slice(max(0, len(data.split.test[u].history) - cap)) for u in users]
        scores = np.stack([full_path_logits(model, h, chunks) for h in cut])
        ranks = full_ranking_ranks(scores, np.array([data.split.test[u].item_id for u in users]),
                                   [h.item_ids for h in cut])
        expected = ranking_metrics_at(ranks)
        for metric in ("hr@10", "ndcg@10", "mrr"):
            assert row[metric] == pytest.approx(expected[metric], abs=1e-9), (cap, metric)
        assert row["capped_users"] == sum(1 for u in users if len(data.split.test[u].history) > cap) > 0
    assert report["rows"][0]["ndcg@10"] != report["rows"][1]["ndcg@10"]  # the cut changes what the model sees


def test_caps_command_writes_json_and_plot(synthetic_config, trained_run, tmp_path, capsys):
    from mindspore_relaygr.cli import main
    from mindspore_relaygr.config import save_config

    config_path = tmp_path / "config.yaml"
    save_config(synthetic_config, config_path)
    out = tmp_path / "caps.json"
    assert main(["caps", "--checkpoint", str(trained_run.checkpoint), "--config", str(config_path),
                 "--caps", "4", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["cap"] for r in report["rows"]] == [2, 4] and "machine" in report
    assert out.with_suffix(".png").stat().st_size > 0
    assert "model trained on up to" in capsys.readouterr().out
    assert main(["caps", "--checkpoint", str(trained_run.checkpoint), "--config", str(config_path),
                 "--caps", "100000", "--out", str(out)]) == 2
