"""The fused dense kernels (ProjectSilu, FinishRows) against numpy, at row counts around the tile split
and widths around the 16-lane vector step."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fused_ops(tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model.kernels import load_fused_ops
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)
    ops = load_fused_ops()
    if ops is None:
        pytest.fail("the fused dense kernels should build here (g++ and MindSpore's oneDNN are present)")
    return ops


def _run(op, *arrays):
    from mindspore import Tensor

    return op(*(Tensor(a) for a in arrays)).asnumpy()


@pytest.mark.parametrize("rows", [1, 37, 128, 200])
def test_project_silu_matches_numpy(fused_ops, rows):
    rng = np.random.default_rng(rows)
    x, w, b = (rng.normal(size=s).astype(np.float32) for s in ((rows, 24), (24, 56), (56,)))
    z = x.astype(np.float64) @ w + b
    np.testing.assert_allclose(_run(fused_ops.project_silu, x, w, b), z / (1 + np.exp(-z)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 37, 128, 200])
def test_finish_rows_matches_numpy(fused_ops, rows):
    rng = np.random.default_rng(rows + 1)
    d, e, eps = 24, 16, 1e-7
    x, av, u, w2 = (rng.normal(size=s).astype(np.float32) for s in ((rows, d), (rows, e), (rows, e), (d, e)))
    gamma, beta, b2 = (rng.normal(size=s).astype(np.float32) for s in (e, e, d))
    norm = (av - av.mean(1, keepdims=True)) / np.sqrt(av.var(1, keepdims=True) + eps) * gamma + beta
    want = x + (norm * u).astype(np.float64) @ w2.T + b2
    got = _run(fused_ops.finish_rows, x, av, u, gamma, beta, w2, b2, np.array([eps], np.float32))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("rows, first_full", [(1, 1), (37, 20), (200, 200), (200, 0), (130, 129)])
def test_project_silu_columns_matches_numpy(fused_ops, rows, first_full):
    """Rows before first_full get only the listed column ranges (zeros elsewhere), the rest every column."""
    rng = np.random.default_rng(rows + first_full)
    x, w, b = (rng.normal(size=s).astype(np.float32) for s in ((rows, 24), (24, 56), (56,)))
    z = x.astype(np.float64) @ w + b
    want = z / (1 + np.exp(-z))
    keep = np.zeros(56, bool)
    keep[8:20] = keep[33:50] = True
    want[:first_full, ~keep] = 0.0
    spec = np.array([first_full, 8, 20, 33, 50], np.int64)
    got = _run(fused_ops.project_silu_columns, x, w, b, spec)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert np.all(got[:first_full, ~keep] == 0.0)


@pytest.mark.parametrize("spec", [[0, 20, 8], [0, 8, 20, 10, 30], [0, 50, 57], [0, 1]])
def test_project_silu_columns_refuses_bad_ranges(fused_ops, spec):
    x, w, b = np.ones((4, 24), np.float32), np.ones((24, 56), np.float32), np.ones(56, np.float32)
    with pytest.raises(RuntimeError):
        _run(fused_ops.project_silu_columns, x, w, b, np.array(spec, np.int64))


def _silu64(z):
    z = np.asarray(z, np.float64)
    return z / (1 + np.exp(-z))


@pytest.mark.parametrize("width", [1, 15, 16, 17, 50])
def test_silu_is_accurate_over_the_whole_input_range(fused_ops, width):
    """SiLU (vector exp + reciprocal step) to ~1e-6 relative from -200 to 200, where exp(-x) overflows and
    underflows, including the masked tail of a width that is not a multiple of 16."""
    z = np.linspace(-200, 200, 7 * width).astype(np.float32).reshape(7, width)
    # x w = 0, so the output is SiLU(b): the inputs go in through the bias, exactly.
    x, w = np.zeros((1, 1), np.float32), np.zeros((1, width), np.float32)
    got = np.stack([_run(fused_ops.project_silu, x, w, row)[0] for row in z])
    np.testing.assert_allclose(got, _silu64(z), rtol=2e-6, atol=1e-30)
    assert np.all(np.isfinite(got))


def test_shape_mismatch_is_refused(fused_ops):
    x, w, b = np.ones((4, 8), np.float32), np.ones((7, 5), np.float32), np.ones(5, np.float32)
    with pytest.raises(RuntimeError):
        _run(fused_ops.project_silu, x, w, b)
