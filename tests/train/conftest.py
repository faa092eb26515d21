"""Synthetic MovieLens data for the training, evaluation and export tests (written by the tests, never shipped)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mindspore_relaygr import load_config
from tests.conftest import CONFIGS

NUM_ITEMS = 60


def write_synthetic_movielens(path: Path, num_users: int = 40, num_items: int = NUM_ITEMS, seed: int = 0) -> Path:
    """A `u.data` file with a pattern a tiny model learns in a few hundred steps: users come in three taste
    groups, each rating only items of its third of the catalogue (in a random order), and even items get
    high ratings. Popularity is flat, so it ranks no better than chance."""
    rng = np.random.default_rng(seed)
    block = num_items // 3
    rows = []
    for user in range(1, num_users + 1):
        first = (user % 3) * block + 1
        items = rng.permutation(np.arange(first, first + block))[: int(rng.integers(10, block + 1))]
        t = 880_000_000 + int(rng.integers(0, 10**6))
        for item in items.tolist():
            rating = int(rng.integers(4, 6)) if item % 2 == 0 else int(rng.integers(1, 4))
            rows.append(f"{user}\t{item}\t{rating}\t{t}")
            t += int(rng.choice([30, 600, 86400]))
    path.mkdir(parents=True, exist_ok=True)
    (path / "u.data").write_text("\n".join(rows) + "\n")
    return path / "u.data"


def synthetic_overrides(data_path: Path, output_dir: Path) -> list[str]:
    """tiny.yaml adapted to the synthetic data (MovieLens u.data: ratings 1..5 are the event types, rating >= 4 the
    label): 5 actions, no user features, one length bucket in use."""
    return [f"model.num_items={NUM_ITEMS}", "model.num_actions=5", "model.user_feature_sizes=[]",
            f"data.path={data_path}", "data.event_column=rating", "data.label_events=[4, 5]",
            "data.num_eval_negatives=20",
            "train.batch_size=8", "train.num_negatives=8",
            "train.negative_pool=16", "train.num_cuts=2",
            "train.epochs=24", "train.log_every=1000", "train.lr=0.005", "train.patience=10",
            "train.eval_every=12", f"train.output_dir={output_dir}", "train.sasrec_epochs=60",
            "train.sasrec_max_len=32", "train.sasrec_batch_size=16", "train.sasrec_d_model=16",
            "train.sasrec_dropout=0.0"]


@pytest.fixture(scope="session")
def synthetic_data_path(tmp_path_factory) -> Path:
    return write_synthetic_movielens(tmp_path_factory.mktemp("movielens"))


@pytest.fixture(scope="session")
def synthetic_config(synthetic_data_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_out")
    return load_config(CONFIGS / "tiny.yaml", synthetic_overrides(synthetic_data_path, out))


@pytest.fixture(scope="session")
def trained_run(synthetic_config):
    """One tiny training run shared by the trainer and evaluation tests."""
    from mindspore_relaygr.train.trainer import train

    return train(synthetic_config)
