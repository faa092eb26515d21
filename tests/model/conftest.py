"""Tiny models shared per test module, or per test process (graphs compile once per shape and model object)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mindspore_relaygr import load_config


def randomize_weights(model, seed: int, scale: float = 0.3) -> None:
    """Replace the small default init by large random weights, so any path difference shows up."""
    from mindspore import Tensor

    rng = np.random.default_rng(seed)
    for param in model.net.get_parameters():
        shape = param.shape
        value = rng.normal(0.0, scale, shape)
        if "gamma" in param.name:  # LayerNorm scale
            value = 1.0 + 0.1 * rng.normal(size=shape)
        param.set_data(Tensor(value.astype(np.float32)))
    model.refresh_weights()


@pytest.fixture(scope="module")
def tiny_config(tiny_config_path):
    return load_config(tiny_config_path)


@pytest.fixture(scope="module")
def tiny_model(tiny_config):
    from mindspore_relaygr.model import RelayGRModel

    model = RelayGRModel(tiny_config)
    randomize_weights(model, seed=1)
    return model


def tiny_on_backend(backend: str, num_slots: int, seed: int):
    """The tiny model with batch buckets 1, 2, 4 on one backend ("fused_cpu": the fused CPU kernels, "plain":
    MindSpore ops, the path Ascend runs), its weights randomized with `seed`."""
    from mindspore_relaygr.model import RelayGRModel
    from tests.conftest import CONFIGS

    cfg = load_config(CONFIGS / "tiny.yaml", [f"cache.num_slots={num_slots}", "model.batch_buckets=[1,2,4]",
                                              f"model.fused_kernels={str(backend == 'fused_cpu').lower()}"])
    m = RelayGRModel(cfg)
    assert m.backend.name == backend, "the fused kernels should build on this CPU (g++ is required)"
    randomize_weights(m, seed=seed)
    return m


SHARED_SLOTS = 8
_shared: dict[str, Any] = {}


def shared_tiny(backend: str, seed: int):
    """The model of tiny_on_backend(backend, SHARED_SLOTS, seed), one object per backend and test process: its
    weights re-randomized with `seed` and its slots released at each call. The files that use it run in one
    worker (tests/conftest.py:SHARED_STATE_GROUPS), so each shape's graph compiles once for all of them."""
    model = _shared.get(backend)
    if model is None:
        model = _shared[backend] = tiny_on_backend(backend, SHARED_SLOTS, seed)
        return model
    randomize_weights(model, seed=seed)
    for slot in range(SHARED_SLOTS):
        model.release_slot(slot)
    return model
