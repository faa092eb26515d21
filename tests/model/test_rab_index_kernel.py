"""RabIndexWindow (bucket indices of a window of the query and key arrays, read in place) against RabIndex on
sliced arrays, and its refusal of windows that overrun the arrays."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernels(tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model.hstu import RelativeBias
    from mindspore_relaygr.model.kernels import load_fused_ops
    from mindspore_relaygr.runtime import configure_context

    cfg = load_config(tiny_config_path)
    configure_context(cfg.context)
    ops = load_fused_ops()
    if ops is None:
        pytest.fail("the fused kernels should build here (g++ is present)")
    return ops, RelativeBias(cfg.model)


def _metadata(rng, n):
    pos = np.arange(n, dtype=np.int32)
    t = np.sort(rng.integers(1_600_000_000, 1_700_000_000, n))
    hi, lo = (t // 65536).astype(np.float32), (t % 65536).astype(np.float32)
    valid = rng.random(n) > 0.1
    return pos, hi, lo, valid


def _run(op, rab, q, k, *extra):
    from mindspore import Tensor

    args = [*q[:3], *k, rab.pos_lut.asnumpy(), rab.kernel_thresholds.asnumpy(), rab.kernel_params.asnumpy(), *extra]
    return op(*(Tensor(a) for a in args)).asnumpy()


@pytest.mark.parametrize("q_rows, k_rows",
                         [((0, 7), (0, 7)), ((5, 12), (0, 12)), ((3, 4), (2, 30)), ((0, 30), (29, 30))])
def test_window_matches_sliced_arrays(kernels, q_rows, k_rows):
    ops, rab = kernels
    rng = np.random.default_rng(q_rows[0] * 31 + k_rows[1])
    meta = _metadata(rng, 30)
    (q0, q1), (k0, k1) = q_rows, k_rows
    want = _run(ops.rab_index, rab, tuple(m[q0:q1] for m in meta), tuple(m[k0:k1] for m in meta))
    got = _run(ops.rab_index_window, rab, meta, meta, np.array([q0, k0], np.int64), np.zeros(q1 - q0, np.int8),
               np.zeros(k1 - k0, np.int8))
    assert got.shape == (q1 - q0, k1 - k0)
    np.testing.assert_array_equal(got, want)
    assert (got == rab.mask_index).any() and (got != rab.mask_index).any()  # both visible and masked pairs


@pytest.mark.parametrize("window, rows, cols", [((25, 0), 6, 4), ((0, 28), 2, 3), ((-1, 0), 2, 2)])
def test_window_outside_the_arrays_is_refused(kernels, window, rows, cols):
    ops, rab = kernels
    meta = _metadata(np.random.default_rng(0), 30)
    with pytest.raises(RuntimeError):
        _run(ops.rab_index_window, rab, meta, meta, np.array(window, np.int64), np.zeros(rows, np.int8),
             np.zeros(cols, np.int8))
