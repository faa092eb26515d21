"""The inputs of every graph, described once: name, dtype and axes, in call order (numpy only).

The ranker checks each call against this description (`check_inputs`), the serving bundle's MindIR input
specs are made from it (`input_specs`), and tests hold every graph's `construct` signature, the ranker's
argument builders and the training feeds to it. Axes are named; `input_specs` takes their sizes:

    tokens    a graph's behaviour tokens (a length bucket, or a prefill chunk)
    features  user feature columns (at least 1)
    suffix    a cached rank's new events (a suffix bucket)
    past      tokens of the cached prefix a graph reads (a prefix bucket)
    past_ids  how a graph finds that prefix in the pool: one int32 row id per (layer, head, past token) with
              plain ops, one int64 strided view per layer (8 numbers) when the backend reads views
    write_ids pool rows a prefill chunk writes: (layer, head, token) of its `tokens`
    candidates, users (a batch bucket), layers, heads, d_qk, d_v, one (= 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np


@dataclass(frozen=True)
class GraphInput:
    """One input of a graph: its name, numpy dtype and named axes."""

    name: str
    dtype: str
    axes: tuple[str, ...]

    @property
    def np_dtype(self) -> np.dtype:
        return _DTYPES[self.dtype]


_DTYPES = {name: np.dtype(name) for name in ("int32", "int64", "float32", "bool")}


def _inputs(*specs: tuple[str, str, tuple[str, ...]]) -> tuple[GraphInput, ...]:
    return tuple(GraphInput(name, dtype, axes) for name, dtype, axes in specs)


def _tokens(axis: str) -> tuple[GraphInput, ...]:
    """A behaviour token block without user features: ids, positions, (hi, lo) times, validity."""
    return _inputs(("item_ids", "int32", (axis,)), ("action_ids", "int32", (axis,)), ("pos", "int32", (axis,)),
                   ("hi", "float32", (axis,)), ("lo", "float32", (axis,)), ("valid", "bool", (axis,)))


def _tokens_with_user(axis: str) -> tuple[GraphInput, ...]:
    """A block that may start with the user token: its features and the row that carries them."""
    ids, actions, pos, hi, lo, valid = _tokens(axis)
    user = _inputs(("user_feats", "int32", ("features",)), ("user_row", "float32", (axis,)))
    return (ids, actions, *user, pos, hi, lo, valid)


CANDIDATES = _inputs(("cand_ids", "int32", ("candidates",)), ("cand_pos", "int32", ("one",)),
                     ("cand_hi", "float32", ("one",)), ("cand_lo", "float32", ("one",)))
LAST = _inputs(("last", "int32", ("one",)))  # the row of the last behaviour token: its final state is the user's


def _past(reads_views: bool) -> tuple[GraphInput, ...]:
    return _inputs(("past_kv_ids", "int64" if reads_views else "int32", ("past_ids",)),
                   ("past_time_ids", "int32", ("past",)), ("past_pos", "int32", ("past",)),
                   ("past_valid", "bool", ("past",)))


NO_PAST = _inputs(("past_kv_ids", "int32", ("one",)), ("past_time_ids", "int32", ("one",)),
                  ("past_pos", "int32", ("one",)), ("past_valid", "bool", ("one",)))  # placeholders, never read
WRITE = _inputs(("write_kv_ids", "int32", ("write_ids",)), ("write_time_ids", "int32", ("tokens",)))
PAST_KV = _inputs(("keys", "float32", ("layers", "heads", "past", "d_qk")),
                  ("values", "float32", ("layers", "heads", "past", "d_v")),
                  ("past_pos", "int32", ("past",)), ("past_hi", "float32", ("past",)),
                  ("past_lo", "float32", ("past",)), ("past_valid", "bool", ("past",)))
PER_USER = ("cand_pos", "cand_hi", "cand_lo", "last")  # batched graphs: one per user ([B]), not [B, 1]

GRAPHS = ("full", "prefix", "extend", "candidate", "candidate_batch", "prefix_batch", "extend_batch", "export_prefix",
          "export_candidate", "export_candidate_batch")


@cache  # the ranker checks every graph call against it: built once per (graph, backend kind)
def graph_inputs(graph: str, reads_views: bool = False) -> tuple[GraphInput, ...]:
    """The inputs of `graph` in call order; `reads_views`: the model's backend reads pool slots through views
    (changes how the pool graphs take a cached prefix)."""
    if graph == "full":
        return (*_tokens_with_user("tokens"), *CANDIDATES, *LAST)
    if graph == "prefix":
        return (*_tokens_with_user("tokens"), *WRITE, *NO_PAST)
    if graph == "extend":
        return (*_tokens_with_user("tokens"), *WRITE, *_past(reads_views))
    if graph == "candidate":
        return (*_tokens("suffix"), *_past(reads_views), *CANDIDATES, *LAST)
    if graph == "candidate_batch":
        return _batched(graph_inputs("candidate", reads_views))
    if graph == "prefix_batch":  # B users' first chunks (the past placeholders become [B, 1])
        return _batched(graph_inputs("prefix", reads_views))
    if graph == "extend_batch":  # B users' chunks, each reading its slot's past (a first chunk's all invalid)
        return _batched(graph_inputs("extend", reads_views))
    if graph == "export_prefix":
        return _tokens_with_user("tokens")
    if graph == "export_candidate":
        return (*PAST_KV, *_tokens("suffix"), *CANDIDATES, *LAST)
    if graph == "export_candidate_batch":
        return _batched(graph_inputs("export_candidate"))
    raise ValueError(f"graph={graph!r}: unknown; one of {GRAPHS}")


def _batched(inputs: tuple[GraphInput, ...]) -> tuple[GraphInput, ...]:
    """B users at once: a leading `users` axis; the per-user scalars become [B]."""
    return tuple(GraphInput(x.name, x.dtype, ("users",) if x.name in PER_USER else ("users", *x.axes))
                 for x in inputs)


def input_names(graph: str) -> tuple[str, ...]:
    return tuple(x.name for x in graph_inputs(graph))


def input_specs(graph: str, sizes: Mapping[str, int], reads_views: bool = False) -> list[dict]:
    """[{name, shape, dtype}] of `graph` with its axes sized by `sizes` (`one` is 1)."""
    sizes = {"one": 1, **sizes}
    specs = []
    for x in graph_inputs(graph, reads_views):
        missing = [axis for axis in x.axes if axis not in sizes]
        if missing:
            raise ValueError(f"{graph} input {x.name!r}: no size for axes {missing}")
        specs.append({"name": x.name, "shape": [int(sizes[axis]) for axis in x.axes], "dtype": x.dtype})
    return specs


def check_inputs(graph: str, arrays: Sequence[np.ndarray], reads_views: bool = False) -> None:
    """ValueError naming the first input of `graph` whose dtype or number of axes differs from the description
    (or a wrong number of inputs): a mistake in an argument builder, never a user's."""
    expected = graph_inputs(graph, reads_views)
    if len(arrays) != len(expected):
        raise ValueError(f"{graph}: {len(arrays)} inputs, expected {len(expected)} ({[x.name for x in expected]})")
    for x, a in zip(expected, arrays, strict=True):
        if a.dtype != x.np_dtype or a.ndim != len(x.axes):
            raise ValueError(f"{graph} input {x.name!r}: {a.dtype} with {a.ndim} axes, expected {x.dtype} "
                             f"with axes {x.axes}")
