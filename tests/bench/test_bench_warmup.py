"""A bench's model is warmed and calibrated for what its engines will call: with batching on, the batched
prefill chunks and batched ranks compile nothing while the bench measures, and the latency model knows what a
batch costs."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.bench import headline
from mindspore_relaygr.model.inputs import CachedRank
from mindspore_relaygr.model.ranker import PrefillChunk
from tests.conftest import CONFIGS, random_history, split_history

pytestmark = pytest.mark.slow


def test_a_bench_model_runs_batched_prefills_and_ranks_without_a_compile():
    cfg = load_config(CONFIGS / "tiny.yaml", ["relay.max_rank_batch=2", "relay.max_prefill_batch=2",  # few shapes:
                                              "model.len_buckets=[128]", "model.candidate_buckets=[8]",
                                              "model.batch_buckets=[1, 2]"])
    model, latency = headline.prepare(cfg, progress=lambda _line: None)
    assert 2 in latency.batch_factors  # measured, not assumed to be two single calls
    rng = np.random.default_rng(3)
    suffix = 4
    hists = [random_history(rng, n + suffix, user_features=[1, 2]) for n in (30, 90)]
    prefixes = [split_history(h, len(h["item_ids"]) - suffix)[0] for h in hists]
    chunk_len = cfg.trigger.prefill_chunk_len
    ends = [model.chunk_ends(len(p["item_ids"]), chunk_len) for p in prefixes]
    done = [0, 0]
    for step in range(max(map(len, ends))):  # the engine's lockstep: each relay's next chunk, one call
        slots = [s for s in (0, 1) if step < len(ends[s])]
        chunks = [PrefillChunk(s, split_history(prefixes[s], ends[s][step])[0], done[s]) for s in slots]
        for s, cached in zip(slots, model.prefill_batch(chunks), strict=True):
            done[s] = cached
    assert done == [30, 90]
    ranks = [CachedRank(s, done[s], split_history(hists[s], done[s])[1], np.arange(1, 9)) for s in (0, 1)]
    assert len(model.rank_cached_batch(ranks)) == 2
    assert model.call_stats.cold_calls == [], [(t.kind, t.shapes) for t in model.call_stats.cold_calls]
