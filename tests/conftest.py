"""Shared fixtures: configs and (module-scoped, since graphs compile once per shape) tiny models."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

os.environ.setdefault("GLOG_v", "3")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
# One shape bucket per axis for tests whose subject is not the buckets: the tiny model then warms up and
# calibrates 3 ranking graphs instead of ~25.
ONE_BUCKET = ("model.len_buckets=[128]", "model.suffix_buckets=[16]", "model.candidate_buckets=[32]")


def cli_overrides(overrides: tuple[str, ...] | list[str]) -> list[str]:
    """`-o KEY=VALUE` arguments of a command line."""
    return [arg for o in overrides for arg in ("-o", o)]


# Test files that take minutes: collected first, so the parallel workers start them first instead of ending
# the run with one of them alone (the order of the tests inside a file is kept).
LONG_FILES = ("serving/test_soak_bench.py", "model/test_batched.py", "model/test_batched_prefill.py",
              "train/test_trainer.py", "serving/test_cluster_bench.py", "train/test_commands.py",
              "tests/test_export.py", "train/test_length_curve.py", "bench/test_bench_smoke.py", "data/test_events.py")


# Test files that share per-process state run as one unit of the parallel run, so in one worker process: the
# compiled graphs of the tiny models of tests/model/conftest.py:shared_tiny, and the training run of
# tests/train/conftest.py:trained_run.
# The tiny-model files are two units, so that neither is the run's critical path (each compiles for minutes).
SHARED_STATE_GROUPS = {
    "shared tiny models: batched ranks": ("tests/model/test_batched.py", "tests/model/test_exactness.py"),
    "shared tiny models: prefills, oracle": ("tests/model/test_batched_prefill.py", "tests/model/test_numpy_oracle.py",
                                             "tests/model/test_fused_vs_reference.py"),
    "trained tiny run": ("tests/train/test_trainer.py", "tests/train/test_evaluate.py",
                         "tests/train/test_averaging.py", "tests/train/test_cap_curve.py"),
}
_GROUP_OF_FILE = {path: group for group, paths in SHARED_STATE_GROUPS.items() for path in paths}


def work_unit(nodeid: str) -> str:
    """The unit of the parallel run a test belongs to: its file, or its file's group in SHARED_STATE_GROUPS."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF_FILE.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with each group of SHARED_STATE_GROUPS as one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedStateScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedStateScheduling(config, log)


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
