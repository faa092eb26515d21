"""The fused CPU kernels compute the same scores as the reference MindSpore ops."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import random_history, split_history

pytestmark = pytest.mark.slow


def test_fused_kernels_match_reference_ops(tmp_path):
    from tests.model.conftest import shared_tiny

    fused = shared_tiny("fused_cpu", seed=1)
    path = tmp_path / "w.ckpt"
    fused.save_checkpoint(path)
    reference = shared_tiny("plain", seed=2)
    reference.load_checkpoint(path)
    rng = np.random.default_rng(11)
    for n in (1, 23, 77, 127):
        hist = random_history(rng, n, user_features=[2, 1])
        cands = rng.integers(1, 201, 9)
        np.testing.assert_allclose(reference.rank_full(hist, cands), fused.rank_full(hist, cands), rtol=0, atol=1e-5)
        pre, suf = split_history(hist, max(1, n - 5))
        reference.prefill(0, pre)
        np.testing.assert_allclose(reference.rank_cached(0, len(pre["item_ids"]), suf, cands),
                                   fused.rank_full(hist, cands), rtol=0, atol=1e-5)


def test_time_thresholds_define_buckets_exactly():
    from mindspore_relaygr.model.hstu import time_thresholds

    thr = time_thresholds(24, 1.5)
    assert np.all(np.diff(thr) > 0)
    # bucket(dt) = count of thresholds <= dt, which is floor(log1p(dt) * scale) away from boundaries
    for dt in (0.0, 1.0, 2.0, 100.0, 86400.0, 3e7):
        expect = min(int(np.floor(np.log1p(dt) * 1.5)), 23)
        assert int(np.sum(thr <= np.float32(dt))) == expect


def test_fused_ranking_with_a_multi_block_suffix_matches_reference(tiny_config_path, tmp_path):
    """Suffix rows spread over several query blocks: the merged suffix + candidate past call splits right."""
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model import RelayGRModel
    from tests.model.conftest import randomize_weights

    # One length bucket (128): the 16 query blocks per layer make each graph slow to compile.
    small_blocks = ["model.attention_block_len=8", "cache.num_slots=1", "model.len_buckets=[128]"]
    fused = RelayGRModel(load_config(tiny_config_path, small_blocks))
    randomize_weights(fused, seed=5)
    assert fused.backend.name == "fused_cpu" and fused.backend.reads_views
    path = tmp_path / "w.ckpt"
    fused.save_checkpoint(path)
    reference = RelayGRModel(load_config(tiny_config_path, small_blocks + ["model.fused_kernels=false"]))
    reference.load_checkpoint(path)
    rng = np.random.default_rng(12)
    for n, suffix in ((40, 15), (100, 9), (64, 1)):
        hist = random_history(rng, n, user_features=[2, 1])
        cands = rng.integers(1, 201, 20)
        pre, suf = split_history(hist, n - suffix)
        fused.prefill(0, pre)
        want = reference.rank_full(hist, cands)
        np.testing.assert_allclose(fused.rank_cached(0, n - suffix, suf, cands), want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(fused.rank_full(hist, cands), want, rtol=0, atol=1e-5)
