"""`relaygr ties`: the test metrics under other orders of equal timestamps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mindspore_relaygr.train.tie_order import summarize
from tests.conftest import CONFIGS
from tests.train.conftest import NUM_ITEMS, synthetic_overrides


def _log_with_ties(path, num_users: int = 24, seed: int = 0):
    """Every user's last three events share one second (so the test and validation targets depend on the
    order of ties); the others are a minute apart."""
    rng = np.random.default_rng(seed)
    rows = []
    for user in range(1, num_users + 1):
        items = rng.permutation(np.arange(1, NUM_ITEMS + 1))[: int(rng.integers(8, 16))]
        t = 880_000_000 + 1000 * user
        for k, item in enumerate(items.tolist()):
            rows.append(f"{user}\t{item}\t{1 + item % 5}\t{t}")
            if k < len(items) - 3:
                t += 60
    path.mkdir(parents=True)
    (path / "u.data").write_text("\n".join(rows) + "\n")
    return path / "u.data"


def test_summary_is_the_spread_over_the_seeds():
    def row(hr):
        metrics = {"hr@10": hr, "ndcg@10": hr / 2, "hr@50": hr, "ndcg@50": hr / 2, "mrr": hr / 3}
        return {"ours": {"all": metrics}, "popularity": {"all": metrics}}

    out = summarize([row(0.2), row(0.3), row(0.4)], ["all"])
    assert out["ours"]["all"]["hr@10"] == pytest.approx({"mean": 0.3, "sd": 0.1, "min": 0.2, "max": 0.4})
    assert summarize([row(0.2)], ["all"])["popularity"]["all"]["mrr"]["sd"] == 0.0


@pytest.mark.slow
def test_ties_command_counts_changed_targets_and_refits_popularity(tmp_path, capsys):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.cli import main
    from mindspore_relaygr.config import save_config
    from mindspore_relaygr.data.sequences import PopularityModel
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import prepare_data

    data = _log_with_ties(tmp_path / "data")
    cfg = load_config(CONFIGS / "tiny.yaml", synthetic_overrides(data, tmp_path / "run"))
    config_path, checkpoint = tmp_path / "config.yaml", tmp_path / "model.ckpt"
    save_config(cfg, config_path)
    RelayGRModel(cfg).save_checkpoint(checkpoint)
    out = tmp_path / "ties.json"
    args = ["ties", "--checkpoint", str(checkpoint), "--config", str(config_path), "--seeds", "3", "4", "5",
            "--filter", "recent200", "--out", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert [r["tie_seed"] for r in report["rows"]] == [None, 3, 4, 5] and list(report["filters"]) == ["recent200"]
    base = prepare_data(cfg)
    assert report["rows"][0]["targets_changed"] == report["rows"][0]["targets_trained_on"] == 0
    for row in report["rows"][1:]:
        other = prepare_data(load_config(config_path, [f"data.tie_seed={row['tie_seed']}"]))
        changed = [u for u in base.split.test if other.split.test[u].item_id != base.split.test[u].item_id]
        # Trained on (the holdout split trains neither target): the new target was the file order's third-last.
        trained = [u for u in changed if other.split.test[u].item_id in base.split.train[u].item_ids[-1:]]
        assert row["targets_changed"] == len(changed) > 0 and row["targets_trained_on"] == len(trained)
        popularity = PopularityModel().fit(other.training_sequences(False)).score(np.arange(NUM_ITEMS + 1))
        ranks = []
        for u in sorted(other.split.test):
            t = other.split.test[u]
            ranked = np.setdiff1d(np.arange(1, NUM_ITEMS + 1), t.history.item_ids[-200:])
            ranked = np.union1d(ranked, [t.item_id])
            ranks.append(int(np.sum(popularity[ranked] >= popularity[t.item_id])))
        assert row["popularity"]["recent200"]["mrr"] == pytest.approx(np.mean(1.0 / np.array(ranks)))
    hr = [r["ours"]["recent200"]["hr@10"] for r in report["rows"][1:]]
    assert report["summary"]["ours"]["recent200"]["hr@10"]["mean"] == pytest.approx(np.mean(hr))
    assert "popularity over 3 seeds" in capsys.readouterr().out
    assert main([*args[:-2], "--seeds", "3", "3"]) == 2
