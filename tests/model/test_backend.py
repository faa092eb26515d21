"""One backend per model: how `model.fused_kernels` and the device target select it, what happens without the
kernels, and that every graph of a model runs the one backend object."""

from __future__ import annotations

import logging

import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.model import kernels
from mindspore_relaygr.model.backend import FusedCpuOps, PlainOps, select_backend
from tests.conftest import CONFIGS

MISSING = "oneDNN (libdnnl.so*) not found in the MindSpore package"


def model_config(fused_kernels: str):
    return load_config(CONFIGS / "tiny.yaml", [f"model.fused_kernels={fused_kernels}"]).model


@pytest.fixture
def no_kernels(monkeypatch):
    """The kernel loader reports them unavailable, as on a machine without oneDNN."""

    def unavailable():
        raise kernels.KernelsUnavailable(MISSING)

    monkeypatch.setattr(kernels, "require_fused_ops", unavailable)


@pytest.fixture
def loader_must_not_run(monkeypatch):
    def fail():
        raise AssertionError("the kernels were loaded although the backend needs none")

    monkeypatch.setattr(kernels, "require_fused_ops", fail)


def test_false_selects_plain_without_loading_the_kernels(loader_must_not_run):
    backend = select_backend(model_config("false"), "CPU")
    assert isinstance(backend, PlainOps) and backend.name == "plain" and not backend.reads_views


def test_null_on_a_non_cpu_target_selects_plain(loader_must_not_run):
    assert select_backend(model_config("null"), "Ascend").name == "plain"


def test_true_on_a_non_cpu_target_is_an_error(loader_must_not_run):
    cfg = model_config("null")
    cfg.fused_kernels = True  # the config check refuses this pair; select_backend refuses it too
    with pytest.raises(RuntimeError, match="CPU kernels"):
        select_backend(cfg, "Ascend")


def test_true_without_the_kernels_is_an_error_naming_what_is_missing(no_kernels):
    with pytest.raises(RuntimeError, match="model.fused_kernels=true") as err:
        select_backend(model_config("true"), "CPU")
    assert MISSING in str(err.value)


def test_null_without_the_kernels_selects_plain_and_says_why(no_kernels, caplog):
    with caplog.at_level(logging.INFO, logger="mindspore_relaygr.model.backend"):
        backend = select_backend(model_config("null"), "CPU")
    assert backend.name == "plain"
    assert "model backend: plain" in caplog.text and MISSING in caplog.text


def test_without_onednn_the_loader_names_it_and_no_partial_backend_remains(monkeypatch):
    """No oneDNN: no op is returned at all (the attention and projection kernels need it), so the model runs plain."""
    monkeypatch.setattr(kernels, "_cached", None)
    monkeypatch.setattr(kernels, "_problem", None)
    monkeypatch.setattr(kernels, "find_onednn", lambda: None)
    with pytest.raises(kernels.KernelsUnavailable, match="oneDNN"):
        kernels.require_fused_ops()
    assert kernels.load_fused_ops() is None
    assert select_backend(model_config("null"), "CPU").name == "plain"


def test_null_on_cpu_with_the_kernels_selects_fused_cpu():
    backend = select_backend(model_config("null"), "CPU")
    assert isinstance(backend, FusedCpuOps) and backend.name == "fused_cpu" and backend.reads_views


def test_every_graph_of_a_model_runs_its_one_backend(tiny_model):
    from mindspore import ops

    assert tiny_model.backend.name == "fused_cpu"
    graphs = tiny_model._graphs
    for kind in ("full", "prefix", "extend", "candidate", "candidate_batch"):
        assert graphs[kind].backend is tiny_model.backend, kind
    # The network and the pool hold parameters and shared helpers only: the kernels live in the backend.
    for cell in (*(c for _, c in tiny_model.net.cells_and_names()), tiny_model.pool):
        held = [name for name, value in vars(cell).items() if isinstance(value, ops.Custom)]
        assert not held and not hasattr(cell, "enable_fused"), type(cell).__name__


def test_a_batched_graph_refuses_the_other_kind_of_backend(tiny_model):
    from mindspore_relaygr.model.batched import BatchedCandidateGraph, PlainBatchedCandidateGraph

    with pytest.raises(ValueError, match="reads views"):
        BatchedCandidateGraph(tiny_model.net, tiny_model.pool, PlainOps())
    with pytest.raises(ValueError, match="does not read views"):
        PlainBatchedCandidateGraph(tiny_model.net, tiny_model.pool, tiny_model.backend)
