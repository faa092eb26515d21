"""prefill_batch: several users' prefill chunks in one graph call leave every slot as its own prefill calls do,
over mixes of first chunks and extensions of different chunk and past lengths, on both backends."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mindspore_relaygr import load_config
from mindspore_relaygr.errors import InvalidRequest
from mindspore_relaygr.model.ranker import PrefillChunk
from tests.conftest import CONFIGS, random_history, split_history
from tests.model.conftest import shared_tiny

pytestmark = pytest.mark.slow
TOL = 1e-5
REFERENCE = 4  # user i of a batch writes slot i; its reference (own prefill calls) slot i + REFERENCE
SUFFIX = 4  # events ranked after the cached ones


@pytest.fixture(scope="module", params=["fused_cpu", "plain"])
def model(request):
    return shared_tiny(request.param, seed=13)


def _head(hist: dict, events: int) -> dict:
    return split_history(hist, events)[0]


@st.composite
def mixes(draw):
    """3 users (a batch bucket of 4): (events cached before the chunk, 0 for a slot's first chunk; events in the
    chunk; seed). Chunks stay in one bucket (32 tokens, two query blocks), pasts in two (32, 64)."""
    return [(draw(st.one_of(st.just(0), st.integers(1, 40))), draw(st.integers(1, 30)), draw(st.integers(0, 9999)))
            for _ in range(3)]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mixes())
@example([(0, 20, 1), (10, 25, 2), (33, 7, 3)])  # a first chunk and extensions of two past buckets
@example([(0, 30, 4), (0, 5, 5), (0, 17, 6)])  # first chunks only: the graph without a past
def test_each_chunk_of_a_batch_caches_as_its_own_prefill(model, mix):
    hists, chunks = [], []
    for i, (cached, events, seed) in enumerate(mix):
        hist = random_history(np.random.default_rng(seed), cached + events + SUFFIX, user_features=[1, 2])
        for slot in (i, i + REFERENCE):
            model.release_slot(slot)
            if cached:
                model.prefill(slot, _head(hist, cached))
        end = cached + events
        assert model.prefill(i + REFERENCE, _head(hist, end), cached) == end
        hists.append(hist)
        chunks.append(PrefillChunk(i, _head(hist, end), cached))
    assert model.prefill_batch(chunks) == [c + e for c, e, _ in mix]
    for i, (hist, (cached, events, _)) in enumerate(zip(hists, mix, strict=True)):
        got, want = model.export_slot(i), model.export_slot(i + REFERENCE)
        np.testing.assert_allclose(got.keys, want.keys, atol=TOL, rtol=0)
        np.testing.assert_allclose(got.values, want.values, atol=TOL, rtol=0)
        for name in ("time_hi", "time_lo"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        for name in ("item_ids", "action_ids", "timestamps"):
            np.testing.assert_array_equal(getattr(got.tokens, name), getattr(want.tokens, name))
        end = cached + events
        suffix = split_history(hist, end)[1]
        cands = np.random.default_rng(end).integers(1, 201, 8)
        np.testing.assert_allclose(model.rank_cached(i, end, suffix, cands, logits=True),
                                   model.rank_full(hist, cands, logits=True), atol=TOL, rtol=0)


def test_a_batch_is_refused_before_any_write(model):
    """Two chunks of one slot, more chunks than the largest batch bucket, or one invalid chunk: nothing runs."""
    hist = random_history(np.random.default_rng(0), 20, user_features=[1, 2])
    model.release_slot(0)
    model.release_slot(1)
    with pytest.raises(ValueError, match="repeat"):
        model.prefill_batch([PrefillChunk(0, hist), PrefillChunk(0, hist)])
    with pytest.raises(InvalidRequest, match="largest batch bucket 4"):
        model.prefill_batch([PrefillChunk(slot, hist) for slot in range(5)])
    with pytest.raises(InvalidRequest, match="slot 1 holds 0 events, cannot extend from 5"):
        model.prefill_batch([PrefillChunk(0, hist), PrefillChunk(1, hist, start=5)])
    assert model.slot_events(0) == model.slot_events(1) == 0


def test_warmup_compiles_the_batched_prefill_buckets_up_to_max_prefill_batch():
    """After warmup(max_chunk=32, max_prefill_batch=2), two users' chunked prefills in lockstep (one a chunk behind,
    so first chunks mix with extensions, up to a full slot) compile nothing on the request path; a batch of 3
    (bucket 4, not warmed) is reported cold, so the check can fail."""
    from mindspore_relaygr.model import RelayGRModel

    m = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=3", "model.batch_buckets=[1,2,4]"]))
    m.warmup(graphs=("prefix",), max_chunk=32, max_prefill_batch=2)
    capacity = m.layout.slot_len - 1  # events besides the user token
    rng = np.random.default_rng(3)
    hists = [random_history(rng, capacity, user_features=[1, 2]) for _ in range(3)]
    m.prefill_batch([PrefillChunk(i, _head(hists[i], 20)) for i in (0, 2)])  # first chunks only
    ends = [0, 0]
    while ends[1] < capacity:
        # a chunk of 32 tokens each (the first one holds the user token); user 1 starts one chunk later
        active = [i for i in (0, 1) if ends[i] < capacity and (i == 0 or ends[0] > 0)]
        chunks = [PrefillChunk(i, _head(hists[i], min(capacity, ends[i] + (32 if ends[i] else 31))), ends[i])
                  for i in active]
        for chunk, end in zip(chunks, m.prefill_batch(chunks), strict=True):
            ends[chunk.slot] = end
    assert [m.slot_events(i) for i in (0, 1)] == [capacity, capacity]
    assert m.call_stats.cold_calls == []
    m.prefill_batch([PrefillChunk(i, _head(hists[i], 10)) for i in range(3)])
    assert [(c.kind, c.shapes[0][0]) for c in m.call_stats.cold_calls] == [("prefix_batch", 4)]


def test_warmup_covers_one_users_past_bucket_next_to_another_users_chunk_bucket():
    """A slot extended past 64 tokens (past bucket 128) next to another slot's first chunk of 100 events (chunk
    bucket 128) pads to (128, 128), a pair no single user's prefill reaches in a 128-token slot: warmed too."""
    from mindspore_relaygr.model import RelayGRModel

    m = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=2", "model.batch_buckets=[1,2]",
                                                         "model.len_buckets=[64, 128]"]))
    m.warmup(graphs=("prefix",), max_prefill_batch=2)
    rng = np.random.default_rng(4)
    hists = [random_history(rng, 120, user_features=[1, 2]) for _ in range(2)]
    m.prefill(0, _head(hists[0], 90))
    assert m.prefill_batch([PrefillChunk(0, _head(hists[0], 110), 90), PrefillChunk(1, _head(hists[1], 100))]) == [
        110, 100]
    assert m.call_stats.cold_calls == []

