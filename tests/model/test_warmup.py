"""warmup() compiles the prefix graphs and the spill/reload copies, and leaves the pool empty."""

from __future__ import annotations

import re

import pytest

from mindspore_relaygr import load_config
from tests.conftest import CONFIGS

pytestmark = pytest.mark.slow


def test_prefix_warmup_covers_slot_copies_and_leaves_slot_zero_free(monkeypatch):
    """After a prefix warm-up, spilling (export) and reloading (import) a prefix of any bucket runs only
    signatures the warm-up compiled: no graph call is cold. (Two length buckets: each more adds its chunk x past
    pairs to compile.) Its progress counts the compiles up to the total (reported after every one here)."""
    from mindspore_relaygr.model import RelayGRModel, ranker
    from mindspore_relaygr.model.inputs import synthetic_history

    monkeypatch.setattr(ranker, "WARMUP_REPORT_S", 0.0)
    model = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2", "model.len_buckets=[64, 128]"]))
    said: list[str] = []
    result = model.warmup(graphs=("prefix",), progress=said.append)
    steps = [re.match(r"warm-up: (\d+) of (\d+) graph shapes compiled \(prefix ", m) for m in said[:-1]]
    assert all(steps), said
    assert [int(m[1]) for m in steps] == list(range(1, len(steps) + 1))
    assert {int(m[2]) for m in steps} == {result["graphs"]}  # the total counts the slot copies too
    assert re.fullmatch(rf"warm-up: {result['graphs']} graph shapes compiled in \d+ s", said[-1]), said[-1]
    with pytest.raises(ValueError, match="holds nothing"):
        model.export_slot(0)
    for bucket in model.prefix_buckets:
        events = bucket - 1  # the tiny model's user token fills the bucket
        list(model.prefill_steps(1, synthetic_history(model.cfg, events, seed=bucket), 32))
        copy = model.export_slot(1)
        model.release_slot(1)
        model.import_slot(0, copy)
        model.release_slot(0)
    kinds = {t.kind for t in model.call_stats.cold_calls}
    assert model.call_stats.cold_calls == [], f"cold graph calls after warm-up: {sorted(kinds)}"


def test_prefix_warmup_covers_every_chunk_of_a_chunked_prefill_up_to_the_slot():
    """A chunk near the end of the slot reads the largest past bucket: it must be warmed up too
    (it once was not, and compiled for 1.4 s on the first long prefill under load)."""
    from mindspore_relaygr.model import RelayGRModel
    from mindspore_relaygr.model.inputs import synthetic_history

    model = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2"]))
    model.warmup(graphs=("prefix",), max_chunk=32)
    capacity = model.layout.slot_len - 1  # events besides the user token
    for chunk in (32, 24):
        model.release_slot(1)
        ends = list(model.prefill_steps(1, synthetic_history(model.cfg, capacity, seed=chunk), chunk))
        assert ends[-1] == capacity
    assert model.call_stats.cold_calls == []
