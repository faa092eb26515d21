"""The fused dense kernels (ProjectSilu, FinishRows) against numpy, at row counts around the tile split."""

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
    if ops is None or ops.project_silu is None or ops.finish_rows is None:
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


def test_shape_mismatch_is_refused(fused_ops):
    x, w, b = np.ones((4, 8), np.float32), np.ones((7, 5), np.float32), np.ones(5, np.float32)
    with pytest.raises(RuntimeError):
        _run(fused_ops.project_silu, x, w, b)
