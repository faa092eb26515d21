"""Data-parallel training under msrun: two workers train exactly what one process trains with the same global
batch (the mean of the workers' losses equals the single process's loss, step after step)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mindspore_relaygr import load_config
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def _equal_length_data(path: Path) -> Path:
    """32 users with 30 events each: every row of a batch has as many tokens, so the mean of the two
    workers' per-row-weighted losses is the single process's loss."""
    rng = np.random.default_rng(0)
    rows = []
    for user in range(1, 33):
        items = rng.permutation(np.arange(1, 61))[:30]
        for k, item in enumerate(items.tolist()):
            rows.append(f"{user}\t{item}\t{int(rng.integers(1, 6))}\t{880_000_000 + 600 * k}")
    path.mkdir(parents=True)
    (path / "u.data").write_text("\n".join(rows) + "\n")
    return path / "u.data"


def _overrides(data: Path) -> list[str]:
    return ["model.num_items=60", "model.num_actions=5", "model.user_feature_sizes=[]", "model.dropout=0.0",
            f"data.path={data}", "data.event_column=rating", "data.label_events=[4, 5]", "data.num_eval_negatives=20",
            "train.batch_size=16", "train.num_negatives=8",
            "train.negative_pool=16", "train.epochs=3", "train.eval_every=3",
            "train.log_every=1000", "train.lr=0.01"]


def test_two_msrun_workers_match_one_process(tmp_path):
    from mindspore_relaygr.train.trainer import train

    data = _equal_length_data(tmp_path / "data")
    overrides = _overrides(data)
    single = train(load_config(CONFIGS / "tiny.yaml", [*overrides, f"train.output_dir={tmp_path / 'one'}"]))

    out = tmp_path / "two"
    args = [x for o in overrides for x in ("-o", o)]
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "run_distribute_train.sh"), "2", str(CONFIGS / "tiny.yaml"),
                           str(out), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    logs = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((out / "msrun_log").glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + logs
    per_rank = [json.loads((out / f"step_losses.rank{r}.json").read_text()) for r in (0, 1)]
    assert len(per_rank[0]) == len(per_rank[1]) == len(single.step_losses) == 6
    assert per_rank[0] != per_rank[1]  # each worker trains on its own half of every batch
    np.testing.assert_allclose(np.mean(per_rank, axis=0), single.step_losses, rtol=2e-4)
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["workers"] == 2 and (out / "best.ckpt").is_file()
