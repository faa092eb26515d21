"""Shared fixtures: configs and (module-scoped, since graphs compile once per shape) tiny models."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("GLOG_v", "3")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


# Test files that take minutes: collected first, so the parallel workers start them first instead of ending
# the run with one of them alone (the order of the tests inside a file is kept).
LONG_FILES = ("serving/test_soak_bench.py", "model/test_batched.py", "model/test_batched_prefill.py",
              "bench/test_quality_at_slo.py", "serving/test_cluster_bench.py", "train/test_commands.py",
              "model/test_fused_vs_reference.py", "model/test_numpy_oracle.py", "data/test_events.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.path.as_posix()
        return next((i for i, name in enumerate(LONG_FILES) if path.endswith(name)), len(LONG_FILES))

    items.sort(key=rank)  # stable


@pytest.fixture(scope="session", autouse=True)
def mindspore_context() -> None:
    """Each test process sets MindSpore's context (the tiny config's: CPU, graph mode) before any test runs an
    op: MindSpore refuses a device set after its runtime started, and test files reach the parallel workers in
    any order."""
    from mindspore_relaygr import load_config
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(CONFIGS / "tiny.yaml").context)


@pytest.fixture(scope="session")
def tiny_config_path() -> Path:
    return CONFIGS / "tiny.yaml"


def random_history(rng: np.random.Generator, n: int, num_items: int = 200, num_actions: int = 4,
                   user_features: list[int] | None = None) -> dict[str, np.ndarray]:
    """A chronological history of n events (timestamps spread over ~3 years, with repeats)."""
    gaps = rng.choice([0, 1, 5, 60, 3600, 86400, 86400 * 30], size=n)
    hist = {
        "item_ids": rng.integers(1, num_items + 1, n),
        "action_ids": rng.integers(0, num_actions, n),
        "timestamps": 1_600_000_000 + np.cumsum(gaps),
    }
    if user_features is not None:
        hist["user_features"] = np.asarray(user_features)
    return hist


def split_history(hist: dict[str, np.ndarray], k: int) -> tuple[dict, dict]:
    """(events [0, k) with the user features, events [k, n))."""
    pre = {key: (v if key == "user_features" else v[:k]) for key, v in hist.items()}
    suf = {key: v[k:] for key, v in hist.items() if key != "user_features"}
    return pre, suf
