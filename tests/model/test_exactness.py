"""Invariant R1: rank_cached(prefill(x)) == rank_full(x), and the properties it rests on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import random_history, split_history
from tests.model.conftest import shared_tiny

pytestmark = pytest.mark.slow
TOL = 1e-5
USER = [1, 3]


@pytest.fixture(scope="module")
def model():
    """The tiny model on the fused CPU kernels, its weights randomized with seed 1 (its graphs are shared with
    the other files of its group: tests/model/conftest.py:shared_tiny)."""
    return shared_tiny("fused_cpu", seed=1)


def _cands(rng, m):
    return rng.integers(1, 201, m)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 127), suffix=st.integers(0, 16), m=st.integers(1, 32),
       slot=st.integers(0, 3))
def test_cached_equals_full(model, seed, n, suffix, m, slot):
    rng = np.random.default_rng(seed)
    suffix = min(suffix, n - 1)
    hist = random_history(rng, n, user_features=USER)
    cands = _cands(rng, m)
    pre, suf = split_history(hist, n - suffix)
    full = model.rank_full(hist, cands)
    assert model.prefill(slot, pre) == n - suffix
    cached = model.rank_cached(slot, n - suffix, suf, cands)
    assert full.shape == (m, 2)
    np.testing.assert_allclose(cached, full, rtol=0, atol=TOL)


def test_scores_depend_on_the_prefix(model):
    """Guards the exactness tests against a model that ignores history (they would pass trivially)."""
    rng = np.random.default_rng(3)
    hist = random_history(rng, 60, user_features=USER)
    cands = _cands(rng, 8)
    base = model.rank_full(hist, cands)
    changed = dict(hist, action_ids=hist["action_ids"].copy())
    changed["action_ids"][2] = (changed["action_ids"][2] + 1) % 4
    assert np.abs(model.rank_full(changed, cands) - base).max() > 1e-4
    later = dict(hist, timestamps=hist["timestamps"].copy())
    later["timestamps"][:5] -= 86400 * 300  # older early events: a different time bias
    assert np.abs(model.rank_full(later, cands) - base).max() > 1e-4


def test_candidates_are_independent(model):
    rng = np.random.default_rng(4)
    hist = random_history(rng, 40, user_features=USER)
    cands = _cands(rng, 12)
    base = model.rank_full(hist, cands)
    perm = rng.permutation(12)
    np.testing.assert_allclose(model.rank_full(hist, cands[perm]), base[perm], rtol=0, atol=TOL)
    kept = np.delete(np.arange(12), 5)
    np.testing.assert_allclose(model.rank_full(hist, cands[kept]), base[kept], rtol=0, atol=TOL)
    # 9 candidates pad to the 32-bucket, 8 fit the 8-bucket: padding must not matter either.
    np.testing.assert_allclose(model.rank_full(hist, cands[:8]), base[:8], rtol=0, atol=TOL)


def _slot_rows(model, slot, tokens):
    kv_ids, time_ids = model.layout.read_ids(slot, tokens)
    return (model.pool.keys.asnumpy()[kv_ids], model.pool.values.asnumpy()[kv_ids],
            model.pool.time_hi.asnumpy()[time_ids], model.pool.time_lo.asnumpy()[time_ids])


@pytest.mark.parametrize("bounds", [[5, 40, 41, 90], [1, 2, 3], [64], [30, 100]])
def test_extension_in_chunks_equals_one_shot(model, bounds):
    rng = np.random.default_rng(len(bounds))
    hist = random_history(rng, 100, user_features=USER)
    cands = _cands(rng, 10)
    model.prefill(0, hist)
    one_shot = _slot_rows(model, 0, 101)
    start = 0
    for stop in [*bounds, 100]:
        pre, _ = split_history(hist, stop)
        model.prefill(1, pre, start=start)
        start = stop
    chunked = _slot_rows(model, 1, 101)
    for a, b in zip(one_shot, chunked, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    np.testing.assert_allclose(model.rank_cached(1, 100, split_history(hist, 100)[1], cands),
                               model.rank_cached(0, 100, split_history(hist, 100)[1], cands), rtol=0, atol=TOL)


@pytest.mark.parametrize("chunk_len", [1, 7, 32, 101, 500])
def test_prefill_steps_yield_each_chunk_and_equal_one_shot(model, chunk_len):
    rng = np.random.default_rng(chunk_len)
    hist = random_history(rng, 100, user_features=USER)
    model.prefill(0, hist)
    model.release_slot(1)
    ends = list(model.prefill_steps(1, hist, chunk_len))
    # the first chunk also holds the user token; each chunk is at most chunk_len tokens
    want = list(range(max(1, chunk_len - 1), 100, chunk_len)) + [100]
    assert ends == want and model.slot_events(1) == 100
    for a, b in zip(_slot_rows(model, 0, 101), _slot_rows(model, 1, 101), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="chunk_len"):
        next(model.prefill_steps(1, hist, 0))


def test_prefix_cache_does_not_depend_on_what_follows(model):
    rng = np.random.default_rng(7)
    hist = random_history(rng, 90, user_features=USER)
    pre, _ = split_history(hist, 50)
    model.prefill(2, pre)
    model.prefill(3, hist)
    for a, b in zip(_slot_rows(model, 2, 51), _slot_rows(model, 3, 51), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_slots_do_not_interfere(model):
    rng = np.random.default_rng(8)
    hist_a = random_history(rng, 70, user_features=USER)
    hist_b = random_history(rng, 120, user_features=[2, 4])
    cands = _cands(rng, 16)
    pre_a, suf_a = split_history(hist_a, 60)
    model.prefill(0, pre_a)
    before = model.rank_cached(0, 60, suf_a, cands)
    for slot in (1, 2, 3):
        model.prefill(slot, hist_b)
    after = model.rank_cached(0, 60, suf_a, cands)
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(after, model.rank_full(hist_a, cands), rtol=0, atol=TOL)


def test_padding_to_other_buckets_and_checkpoint_round_trip(model, tiny_config, tmp_path):
    """A model with one big length bucket (more padding), loaded from a checkpoint, scores the same."""
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model import RelayGRModel

    path = tmp_path / "tiny.ckpt"
    model.save_checkpoint(path)
    cfg = load_config(None, [f"{k}={v}" for k, v in {
        **{f"model.{f}": getattr(tiny_config.model, f) for f in (
            "num_items", "num_actions", "d_model", "num_layers", "num_heads", "d_qk", "d_v", "max_seq_len",
            "num_pos_buckets", "num_time_buckets", "time_bucket_scale")},
        "model.user_feature_sizes": "[3, 5]", "model.len_buckets": "[128]", "model.suffix_buckets": "[16]",
        "model.candidate_buckets": "[32]", "model.attention_block_len": 128, "cache.max_prefix_len": 128,
        "cache.num_slots": 1}.items()])
    other = RelayGRModel(cfg)
    other.load_checkpoint(path)
    rng = np.random.default_rng(9)
    hist = random_history(rng, 20, user_features=USER)
    cands = _cands(rng, 5)
    np.testing.assert_allclose(other.rank_full(hist, cands), model.rank_full(hist, cands), rtol=0, atol=TOL)
    pre, suf = split_history(hist, 17)
    other.prefill(0, pre)
    np.testing.assert_allclose(other.rank_cached(0, 17, suf, cands), model.rank_full(hist, cands),
                               rtol=0, atol=TOL)


def test_user_state_of_a_slot_survives_a_host_round_trip(model):
    """A rank that adds no event to the cached prefix recomputes the prefix's last event from the slot's host
    mirror (K/V alone do not give its final state); the mirror travels with the DRAM copy."""
    rng = np.random.default_rng(11)
    hist = random_history(rng, 50, user_features=USER)
    cands = _cands(rng, 9)
    model.prefill(0, hist)
    copy = model.export_slot(0)
    model.release_slot(0)
    model.import_slot(2, copy)
    nothing = {key: v[:0] for key, v in hist.items() if key != "user_features"}
    np.testing.assert_allclose(model.rank_cached(2, 50, nothing, cands), model.rank_full(hist, cands),
                               rtol=0, atol=TOL)
    # The first 40 cached events alone, with and without the rest as the suffix.
    pre, suf = split_history(hist, 40)
    np.testing.assert_allclose(model.rank_cached(2, 40, nothing, cands), model.rank_full(pre, cands),
                               rtol=0, atol=TOL)
    np.testing.assert_allclose(model.rank_cached(2, 40, suf, cands), model.rank_full(hist, cands),
                               rtol=0, atol=TOL)


def test_engage_is_the_user_state_against_the_item(model):
    """The engage logit of a candidate is cos(user state, item embedding) / temperature: the same for a
    candidate whatever else is ranked, and the high-rating logit depends on the candidate token."""
    rng = np.random.default_rng(12)
    hist = random_history(rng, 20, user_features=USER)
    a = model.rank_full(hist, np.array([5, 6]), logits=True)
    b = model.rank_full(hist, np.array([5, 7]), logits=True)
    assert a[0, 0] == pytest.approx(b[0, 0], abs=TOL)
    from mindspore import Tensor

    net = model.net
    table = net.item_table.asnumpy()
    # Two items with the same embedding direction get the same engage logit.
    scaled = table.copy()
    scaled[8] = 3.0 * scaled[5]
    net.item_table.set_data(Tensor(scaled))
    try:
        both = model.rank_full(hist, np.array([5, 8]), logits=True)
    finally:
        net.item_table.set_data(Tensor(table))
    assert both[0, 0] == pytest.approx(both[1, 0], abs=TOL)
    assert abs(both[0, 1] - both[1, 1]) > 1e-6  # the candidate tokens differ: their heads do
