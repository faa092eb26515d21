"""The kernel profile counts every tile GEMM the kernels issue (calls, FLOPs, time inside), the time in their
elementwise work and in their parallel loops, only while it is on."""

from __future__ import annotations

import numpy as np
import pytest

from tests.model.test_kernel_simd_paths import call

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled():
    from mindspore_relaygr.model.kernels import KernelProfile, build_library, init_gemm

    library = build_library()
    if not init_gemm(library):
        pytest.skip("no oneDNN in this MindSpore package: the kernels issue no tile GEMMs")
    profile = KernelProfile(library)
    return profile, profile._lib


def attention_inputs(heads: int, rows: int, keys: int, dq: int, dv: int):
    rng = np.random.default_rng(0)
    q = rng.normal(0, 1, (heads, rows, dq)).astype(np.float32)
    k = rng.normal(0, 1, (heads, keys, dq)).astype(np.float32)
    v = rng.normal(0, 1, (heads, keys, dv)).astype(np.float32)
    table = rng.normal(0, 0.5, (heads, 9)).astype(np.float32)
    idx = rng.integers(0, 8, (rows, keys)).astype(np.int32)  # nothing masked: every key tile is whole
    at = lambda n, w: np.array([0, n * w, w, w], np.int64)  # noqa: E731
    out = np.zeros((rows, heads * dv), np.float32)
    return (q, at(rows, dq), k, at(keys, dq), v, at(keys, dv), idx, table, np.array([1.0, 1.0], np.float32),
            np.zeros_like(out), out)


def test_attention_tiles_are_counted_exactly(profiled):
    profile, lib = profiled
    heads, rows, keys, dq, dv = 2, 40, 600, 16, 8  # rows <= 192: one query tile of 40 rows, key tiles of 256
    args = attention_inputs(heads, rows, keys, dq, dv)
    profile.start()
    assert call(lib.PointwiseAttention, *args) == 0
    counts = profile.read()
    tiles = [256, 256, 88]
    assert counts.gemm_calls == heads * 2 * len(tiles)
    assert counts.gemm_flops == heads * sum(2 * rows * kn * dq + 2 * rows * kn * dv for kn in tiles)
    assert counts.gemm_s > 0 and counts.threads >= 1 and counts.gemm_gflops > 0
    assert counts.elementwise_s > 0  # bias + SiLU of every score tile
    # The loops hold both the GEMMs and the elementwise work (which never overlap on one thread) and more.
    assert counts.kernel_s > counts.gemm_s + counts.elementwise_s


def test_elementwise_only_kernels_count_no_gemm(profiled):
    profile, lib = profiled
    heads, rows, cols = 2, 64, 512
    rng = np.random.default_rng(2)
    scores = rng.normal(0, 1, (heads, rows, cols)).astype(np.float32)
    idx = rng.integers(0, 8, (rows, cols)).astype(np.int32)
    table = rng.normal(0, 0.5, (heads, 9)).astype(np.float32)
    profile.start()
    assert call(lib.BiasSilu, scores, idx, table, np.zeros_like(scores)) == 0
    counts = profile.read()
    assert (counts.gemm_calls, counts.gemm_s, counts.gemm_flops) == (0, 0.0, 0.0)
    assert 0 < counts.elementwise_s <= counts.kernel_s


def test_projection_flops_and_nothing_counted_while_off(profiled):
    profile, lib = profiled
    n, d, width = 150, 32, 48
    rng = np.random.default_rng(1)
    x, w = rng.normal(0, 1, (n, d)).astype(np.float32), rng.normal(0, 1, (d, width)).astype(np.float32)
    b, y = np.zeros(width, np.float32), np.zeros((n, width), np.float32)
    profile.start()
    assert call(lib.ProjectSilu, x, w, b, y) == 0
    counts = profile.read()
    assert counts.gemm_flops == 2 * n * d * width and counts.gemm_calls >= 1
    assert counts.elementwise_s > 0  # bias + SiLU of every projected row
    assert call(lib.ProjectSilu, x, w, b, y) == 0  # the profile is off after read(): not counted
    assert profile.read() == counts
    profile.start()
    restarted = profile.read()  # start() restarts every counter
    assert (restarted.gemm_calls, restarted.gemm_s, restarted.elementwise_s, restarted.kernel_s) == (0, 0.0, 0.0, 0.0)
