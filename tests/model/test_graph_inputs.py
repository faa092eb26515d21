"""One description of every graph's inputs (model/graph_inputs.py): the graphs' signatures, the ranker's calls,
the training feeds and the exported specs all follow it."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.model.graph_inputs import GRAPHS, check_inputs, graph_inputs, input_names, input_specs
from tests.conftest import CONFIGS, random_history


def _params(construct) -> tuple[str, ...]:
    return tuple(inspect.signature(construct).parameters)[1:]  # without self


def test_every_graph_cell_takes_the_described_inputs_in_order():
    from mindspore_relaygr.model.batched import (
        BatchedCandidateGraph,
        BatchedPrefixGraph,
        PlainBatchedCandidateGraph,
        PlainBatchedPrefixGraph,
    )
    from mindspore_relaygr.model.network import CandidateGraph, FullGraph, PrefixGraph

    assert _params(FullGraph.construct) == input_names("full")
    assert _params(PrefixGraph.construct) == input_names("prefix")
    assert [x.name for x in graph_inputs("extend")] == list(input_names("prefix"))  # one cell, two graphs
    assert _params(CandidateGraph.construct) == input_names("candidate")
    assert _params(BatchedCandidateGraph.construct) == input_names("candidate_batch")
    assert _params(PlainBatchedCandidateGraph.construct) == input_names("candidate_batch")
    for cell in (BatchedPrefixGraph, PlainBatchedPrefixGraph):  # one cell per backend, two graphs each
        assert _params(cell.construct) == input_names("prefix_batch") == input_names("extend_batch")


def test_the_exported_cells_take_the_described_inputs_in_order():
    from mindspore_relaygr.export import graph_cells
    from mindspore_relaygr.model.network import HSTUNet

    cfg = load_config(CONFIGS / "tiny.yaml")
    cfg.model.require_sizes()
    cells = graph_cells(HSTUNet(cfg.model))
    for cell, graph in zip(cells, ("export_prefix", "export_candidate", "export_candidate_batch"), strict=True):
        assert _params(type(cell).construct) == input_names(graph)


def test_a_call_that_differs_from_the_description_is_refused_naming_the_input():
    arrays = [np.zeros(4, np.int32)] * 2 + [np.zeros(1, np.int32), np.zeros(4, np.float32), np.zeros(4, np.int32),
                                             np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, bool),
                                             np.zeros(8, np.int32), np.zeros(1, np.int32), np.zeros(1, np.float32),
                                             np.zeros(1, np.float32), np.zeros(1, np.int32)]
    check_inputs("full", arrays)
    bad = list(arrays)
    bad[5] = np.zeros(4, np.float64)
    with pytest.raises(ValueError, match="full input 'hi': float64 with 1 axes, expected float32"):
        check_inputs("full", bad)
    with pytest.raises(ValueError, match="full: 12 inputs, expected 13"):
        check_inputs("full", arrays[:-1])
    with pytest.raises(ValueError, match="graph='fast': unknown"):
        graph_inputs("fast")
    assert set(GRAPHS) >= {"full", "prefix", "extend", "candidate", "candidate_batch", "prefix_batch", "extend_batch"}


def test_pool_graphs_take_a_slot_as_row_ids_or_as_views_by_backend():
    plain = {x.name: x for x in graph_inputs("candidate", reads_views=False)}
    views = {x.name: x for x in graph_inputs("candidate", reads_views=True)}
    assert (plain["past_kv_ids"].dtype, views["past_kv_ids"].dtype) == ("int32", "int64")
    batched = {x.name: x.axes for x in graph_inputs("candidate_batch", reads_views=True)}
    assert batched["past_kv_ids"] == ("users", "past_ids") and batched["last"] == ("users",)
    chunks = {x.name: x for x in graph_inputs("extend_batch", reads_views=True)}
    assert chunks["past_kv_ids"].dtype == "int64" and chunks["write_kv_ids"].axes == ("users", "write_ids")
    assert chunks["user_feats"].axes == ("users", "features")
    first = {x.name: x.axes for x in graph_inputs("prefix_batch", reads_views=True)}
    assert first["past_valid"] == ("users", "one")  # placeholders: a batch of first chunks reads no past


def test_exported_specs_size_every_axis():
    specs = {s["name"]: s for s in input_specs("export_candidate_batch", {"users": 2, "past": 64, "suffix": 8,
                                                                         "candidates": 32, "layers": 2, "heads": 1,
                                                                         "d_qk": 16, "d_v": 16})}
    assert specs["keys"] == {"name": "keys", "shape": [2, 2, 1, 64, 16], "dtype": "float32"}
    assert specs["cand_pos"]["shape"] == [2] and specs["item_ids"]["shape"] == [2, 8]
    with pytest.raises(ValueError, match="export_prefix input 'user_feats': no size for axes \\['features'\\]"):
        input_specs("export_prefix", {"tokens": 8})


def test_the_training_and_export_feeds_follow_the_description():
    from mindspore_relaygr.model.inputs import validate_history
    from mindspore_relaygr.train.feeds import candidate_inputs, full_inputs, prefix_inputs, suffix_inputs

    cfg = load_config(CONFIGS / "tiny.yaml").model
    hist = validate_history(cfg, random_history(np.random.default_rng(0), 30, user_features=[1, 2]))
    cands = np.arange(1, 11)
    check_inputs("full", full_inputs(cfg, hist, cands))
    check_inputs("export_prefix", prefix_inputs(cfg, hist, 32, 20))
    past_meta, suffix = suffix_inputs(cfg, hist, 20, 32)
    keys = np.zeros((cfg.num_layers, cfg.num_heads, 32, cfg.d_qk), np.float32)
    values = np.zeros((cfg.num_layers, cfg.num_heads, 32, cfg.d_v), np.float32)
    arrays = (keys, values, past_meta[0], *past_meta[1:3], past_meta[3], *suffix,
              *candidate_inputs(cfg, cands, 31, 0), np.zeros(1, np.int32))
    check_inputs("export_candidate", arrays)
