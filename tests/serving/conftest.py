"""Fixtures of the serving tests: the tiny config, a FakeEngine (numpy, no MindSpore) and Flask apps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mindspore_relaygr.config import RelayGRConfig, load_config
from serving.app import create_app
from serving.settings import resolve_settings
from tests.conftest import CONFIGS
from tests.serving.fake_engine import FakeEngine  # noqa: F401 - re-exported for the tests

KNOWN_USER = "known-user"


@pytest.fixture(scope="session")
def tiny_config() -> RelayGRConfig:
    return load_config(CONFIGS / "tiny.yaml")


@pytest.fixture
def fake_engine(tiny_config: RelayGRConfig) -> FakeEngine:
    return FakeEngine(tiny_config, instance_id="t0")


@pytest.fixture
def app(tiny_config: RelayGRConfig, fake_engine: FakeEngine):
    settings = resolve_settings(tiny_config, max_content_length=256 * 1024, instance_id="t0")
    return create_app(tiny_config, engine=fake_engine, settings=settings)


@pytest.fixture
def client(app):
    return app.test_client()


def make_history(n: int = 20, seed: int = 0, num_items: int = 200, num_actions: int = 4,
                 user_features: list[int] | None = None) -> dict[str, Any]:
    """A valid JSON-able history of n events (plain Python lists)."""
    rng = np.random.default_rng(seed)
    hist = {
        "item_ids": rng.integers(1, num_items + 1, n).tolist(),
        "action_ids": rng.integers(0, num_actions, n).tolist(),
        "timestamps": (1_700_000_000 + np.cumsum(rng.integers(0, 86400, n))).tolist(),
    }
    if user_features is not None:
        hist["user_features"] = list(user_features)
    return hist


def preinfer_body(user_id: str = KNOWN_USER, n: int = 20, seed: int = 0, **extra: Any) -> dict[str, Any]:
    return {"user_id": user_id, "history": make_history(n, seed, user_features=[1, 2]), **extra}


def rank_body(user_id: str = KNOWN_USER, n: int = 20, seed: int = 0, candidates: list[int] | None = None,
              **extra: Any) -> dict[str, Any]:
    cands = list(range(1, 11)) if candidates is None else candidates
    return {"user_id": user_id, "history": make_history(n, seed, user_features=[1, 2]),
            "candidates": {"item_ids": cands}, **extra}
