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
    """The model reads the cut history; the filter removes the items of the 200 most recent earlier events
    (here every earlier event) whatever the cap."""
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.metrics import paired_difference

    report = quality_vs_cap(synthetic_config, trained_run.checkpoint, [3, 6], progress=lambda m: None)
    assert list(report["filters"]) == ["recent200", "all"]
    data = prepare_data(synthetic_config)
    model = RelayGRModel(synthetic_config)
    model.load_checkpoint(str(trained_run.checkpoint))
    chunks = item_chunks(data.num_items, max(synthetic_config.model.candidate_buckets))
    users = sorted(data.split.test)
    earlier = [data.split.test[u].history.item_ids for u in users]
    assert max(map(len, earlier)) < 200  # so the reference rule removes every earlier item
    ranks = {}
    for row in report["rows"]:
        cap = row["cap"]
        cut = [data.split.test[u].history.slice(max(0, len(data.split.test[u].history) - cap)) for u in users]
        scores = np.stack([full_path_logits(model, h, chunks) for h in cut])
        ranks[cap] = full_ranking_ranks(scores, np.array([data.split.test[u].item_id for u in users]), earlier)
        expected = ranking_metrics_at(ranks[cap])
        for name in ("recent200", "all"):
            for metric in ("hr@10", "ndcg@10", "mrr"):
                assert row["metrics"][name][metric] == pytest.approx(expected[metric], abs=1e-9), (cap, metric)
        assert row["capped_users"] == sum(1 for u in users if len(data.split.test[u].history) > cap) > 0
    first, second = report["rows"]
    assert first["metrics"]["recent200"]["ndcg@10"] != second["metrics"]["recent200"]["ndcg@10"]  # the cut matters
    assert first["change_from"] == {}
    change = second["change_from"]["3"]["recent200"]["ndcg@10"]
    diff, se = paired_difference(ranks[3], ranks[6], "ndcg@10")
    assert change["diff"] == pytest.approx(diff, abs=1e-12) and change["se"] == pytest.approx(se, abs=1e-12)


def test_caps_command_writes_json_and_plot(synthetic_config, trained_run, tmp_path, capsys):
    from mindspore_relaygr.cli import main
    from mindspore_relaygr.config import save_config

    config_path = tmp_path / "config.yaml"
    save_config(synthetic_config, config_path)
    out = tmp_path / "caps.json"
    assert main(["caps", "--checkpoint", str(trained_run.checkpoint), "--config", str(config_path),
                 "--caps", "4", "2", "all", "--filter", "recent3", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    longest = report["model_max_history"]
    assert [r["cap"] for r in report["rows"]] == [2, 4, longest] and "machine" in report
    assert list(report["filters"]) == ["recent3"] and "3 most recent" in report["filters"]["recent3"]
    assert out.with_suffix(".png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "model trained on up to" in printed and "filter recent3" in printed
    assert main(["caps", "--checkpoint", str(trained_run.checkpoint), "--config", str(config_path),
                 "--caps", "100000", "--out", str(out)]) == 2
