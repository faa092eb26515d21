"""Each SIMD path of the kernels (AVX-512, AVX2, the compiler's own vectorization) against numpy.

A machine builds only the widest path its CPU has, so a CI machine with AVX-512 would never run the AVX2 code.
Here every path the CPU can execute is built with the matching -mno-* flags and called through ctypes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

CPU_FLAGS = set(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), []))
# (bits the library must report, extra compiler flags, CPU flags it needs)
PATHS = {
    "avx512": (512, (), {"avx512f"}),
    "avx2": (256, ("-mno-avx512f",), {"avx2", "fma"}),
    "scalar": (0, ("-mno-avx512f", "-mno-avx2", "-mno-fma"), set()),
}


@pytest.fixture(scope="module", params=sorted(PATHS))
def lib(request, tmp_path_factory):
    from mindspore_relaygr.model.kernels import build_library, find_onednn

    bits, flags, needs = PATHS[request.param]
    if not needs <= CPU_FLAGS:
        pytest.skip(f"this CPU lacks {sorted(needs - CPU_FLAGS)} for the {request.param} path")
    mp = pytest.MonkeyPatch()
    mp.setenv("RELAYGR_KERNEL_DIR", str(tmp_path_factory.mktemp(request.param)))
    try:
        library = ctypes.CDLL(str(build_library(extra_flags=flags)))
    finally:
        mp.undo()
    assert library.RelaygrVectorBits() == bits, f"the {request.param} build did not compile its own path"
    assert library.RelaygrInitGemm(str(find_onednn()).encode()) == 1
    return library


def call(fn, *arrays: np.ndarray) -> int:
    n = len(arrays)
    shapes = [(ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for a in arrays]
    return fn(n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]),
              (ctypes.c_int * n)(*[a.ndim for a in arrays]),
              (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shapes]),
              None, None, None)


def silu64(z):
    z = np.asarray(z, np.float64)
    return z / (1 + np.exp(-z))


@pytest.mark.parametrize("cols", [5, 8, 16, 33])
def test_bias_silu(lib, cols):
    """Own index rows (the per-element gather) and one shared row (candidates), widths with and without tails."""
    rng = np.random.default_rng(cols)
    heads, rows, table_cols = 2, 3, 9
    scores = rng.normal(0, 4, (heads, rows, cols)).astype(np.float32)
    table = rng.normal(0, 1, (heads, table_cols)).astype(np.float32)
    for idx_rows in (rows, 1):
        idx = rng.integers(0, table_cols, (idx_rows, cols)).astype(np.int32)  # column table_cols - 1 = masked
        out = np.full_like(scores, np.nan)
        assert call(lib.BiasSilu, scores, idx, table, out) == 0
        full_idx = np.broadcast_to(idx, (rows, cols))
        want = np.where(full_idx == table_cols - 1, 0.0, silu64(scores + table[:, full_idx]))
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)
        assert np.all(out[:, full_idx == table_cols - 1] == 0.0)


def test_silu_over_the_whole_input_range(lib):
    """SiLU from -200 to 200 (exp(-x) overflows and underflows) through ProjectSilu's bias: x w = 0."""
    width = 37
    z = np.linspace(-200, 200, 7 * width).astype(np.float32).reshape(7, width)
    x, w = np.zeros((1, 1), np.float32), np.zeros((1, width), np.float32)
    for row in z:
        y = np.full((1, width), np.nan, np.float32)
        assert call(lib.ProjectSilu, x, w, row.copy(), y) == 0
        np.testing.assert_allclose(y[0], silu64(row), rtol=2e-6, atol=1e-30)


def test_pointwise_attention(lib):
    """The tiled attention (tile GEMMs + bias + SiLU) on a causal block with its own index rows."""
    rng = np.random.default_rng(1)
    heads, rows, keys, dq, dv, table_cols = 2, 70, 600, 16, 8, 41
    mask = table_cols - 1
    q = rng.normal(0, 1, (heads, rows, dq)).astype(np.float32)
    k = rng.normal(0, 1, (heads, keys, dq)).astype(np.float32)
    v = rng.normal(0, 1, (heads, keys, dv)).astype(np.float32)
    table = rng.normal(0, 0.5, (heads, table_cols)).astype(np.float32)
    visible = np.arange(keys)[None, :] <= (keys - rows + np.arange(rows))[:, None]
    idx = np.where(visible, rng.integers(0, mask, (rows, keys)), mask).astype(np.int32)
    q_scale, inv_norm = 0.25, 1.0 / keys
    out = np.full((rows, heads * dv), np.nan, np.float32)
    at = lambda n, w: np.array([0, n * w, w, w], np.int64)  # noqa: E731 (head-major, contiguous)
    assert call(lib.PointwiseAttention, q, at(rows, dq), k, at(keys, dq), v, at(keys, dv), idx, table,
                np.array([q_scale, inv_norm], np.float32), np.zeros((rows, heads * dv), np.float32), out) == 0
    want = []
    for h in range(heads):
        s = (q[h].astype(np.float64) * q_scale) @ k[h].T.astype(np.float64) + table[h][idx]
        want.append(np.where(idx == mask, 0.0, silu64(s)) @ v[h].astype(np.float64) * inv_norm)
    np.testing.assert_allclose(out, np.concatenate(want, axis=1), rtol=1e-4, atol=1e-5)
