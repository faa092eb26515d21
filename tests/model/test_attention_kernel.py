"""The tiled PointwiseAttention kernel against a numpy reference, through strided views of every kind."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

HEADS, DQ, DV, TABLE = 3, 16, 8, 41  # table column TABLE - 1 is the mask entry
MASK = TABLE - 1


@pytest.fixture(scope="module")
def attention_op(tiny_config_path):
    from mindspore_relaygr import load_config
    from mindspore_relaygr.model.kernels import load_fused_ops
    from mindspore_relaygr.runtime import configure_context

    configure_context(load_config(tiny_config_path).context)  # before any op: later models set it otherwise
    ops = load_fused_ops()
    if ops is None:
        pytest.fail("the fused attention kernel should build here (g++ and MindSpore's oneDNN are present)")
    return ops.attention


def reference(q, k, v, idx, table, q_scale, inv_norm):
    """q [H, B, dq], k [H, K, dq], v [H, K, dv], idx [Bi <= B, K] -> [B, H * dv] in float64.

    Query r uses index row min(r, Bi - 1)."""
    rows = q.shape[1]
    idx = idx[np.minimum(np.arange(rows), idx.shape[0] - 1)]
    out = []
    for h in range(q.shape[0]):
        s = (q[h].astype(np.float64) * q_scale) @ k[h].T.astype(np.float64) + table[h][idx]
        w = np.where(idx == MASK, 0.0, s / (1.0 + np.exp(-s)))
        out.append(w @ v[h].astype(np.float64) * inv_norm)
    return np.concatenate(out, axis=1)


def run(op, q_src, q_at, k_src, k_at, v_src, v_at, idx, table, scales, rows):
    from mindspore import Tensor

    like = np.zeros((rows, HEADS * DV), np.float32)
    args = [q_src, np.array(q_at, np.int64), k_src, np.array(k_at, np.int64), v_src, np.array(v_at, np.int64),
            idx.astype(np.int32), table, np.array(scales, np.float32), like]
    return op(*(Tensor(a) for a in args)).asnumpy()


def random_case(rng, rows, keys, shared_idx, causal, idx_rows=None):
    q = rng.normal(0, 1, (HEADS, rows, DQ)).astype(np.float32)
    k = rng.normal(0, 1, (HEADS, keys, DQ)).astype(np.float32)
    v = rng.normal(0, 1, (HEADS, keys, DV)).astype(np.float32)
    table = rng.normal(0, 0.5, (HEADS, TABLE)).astype(np.float32)
    idx = rng.integers(0, MASK + 1, (idx_rows or (1 if shared_idx else rows), keys))
    if causal:  # query i sees keys j <= keys - rows + i, so whole key tiles of early rows are masked
        visible = np.arange(keys)[None, :] <= (keys - rows + np.arange(rows))[:, None]
        idx = np.where(visible, idx, MASK)
    return q, k, v, table, idx


@pytest.mark.parametrize("rows,keys,shared,causal", [(5, 7, False, False), (150, 1100, False, True),
                                                     (128, 1030, True, False), (200, 600, False, True)])
def test_head_major_views_match_numpy(attention_op, rows, keys, shared, causal):
    rng = np.random.default_rng(rows + keys)
    q, k, v, table, idx = random_case(rng, rows, keys, shared, causal)
    got = run(attention_op, q, (0, rows * DQ, DQ, DQ), k, (0, keys * DQ, DQ, DQ), v, (0, keys * DV, DV, DV),
              idx, table, (0.25, 1 / 64), rows)
    np.testing.assert_allclose(got, reference(q, k, v, idx, table, 0.25, 1 / 64), rtol=0, atol=2e-5)


@pytest.mark.parametrize("rows,idx_rows", [(160, 33), (300, 17), (40, 40)])
def test_suffix_rows_then_shared_candidate_row(attention_op, rows, idx_rows):
    """idx with fewer rows than queries: the first rows have their own, the rest share the last (the
    merged suffix + candidates call of the ranking graph)."""
    rng = np.random.default_rng(rows)
    q, k, v, table, idx = random_case(rng, rows, 700, False, False, idx_rows=idx_rows)
    idx[idx_rows - 1, 100:] = MASK  # the shared row masks most keys, the own rows do not
    got = run(attention_op, q, (0, rows * DQ, DQ, DQ), k, (0, 700 * DQ, DQ, DQ), v, (0, 700 * DV, DV, DV),
              idx, table, (0.3, 0.02), rows)
    np.testing.assert_allclose(got, reference(q, k, v, idx, table, 0.3, 0.02), rtol=0, atol=2e-5)


def test_token_major_views_with_row_offset_and_padding(attention_op):
    """Q, K, V as column groups of one [n, W] matrix (like the projection output), queries from row 37."""
    rng = np.random.default_rng(3)
    n, first, rows, pad = 300, 37, 90, 5
    q, k, v, table, idx = random_case(rng, n, n, False, True)
    width = HEADS * (2 * DQ + DV) + pad
    y = np.zeros((n, width), np.float32)
    y[:, 0:HEADS * DQ] = q.transpose(1, 0, 2).reshape(n, -1)
    y[:, HEADS * DQ:2 * HEADS * DQ] = k.transpose(1, 0, 2).reshape(n, -1)
    y[:, 2 * HEADS * DQ:2 * HEADS * DQ + HEADS * DV] = v.transpose(1, 0, 2).reshape(n, -1)
    keys = 250  # the kernel reads only the first `keys` rows of K and V: the index width
    block_idx = idx[first:first + rows, :keys]
    got = run(attention_op, y, (first * width, DQ, width, DQ), y, (HEADS * DQ, DQ, width, DQ),
              y, (2 * HEADS * DQ, DV, width, DV), block_idx, table, (0.5, 0.01), rows)
    want = reference(q[:, first:first + rows], k[:, :keys], v[:, :keys], block_idx, table, 0.5, 0.01)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


def test_pool_like_view_reads_one_slot_in_place(attention_op):
    """K/V rows of slot 2 of a pool laid out [slot, head, slot_len, d], as KVPool.layer_views reads them."""
    rng = np.random.default_rng(4)
    slots, slot_len, rows, keys = 4, 40, 6, 33
    q, k, v, table, idx = random_case(rng, rows, keys, True, False)
    pool_k = rng.normal(0, 1, (slots, HEADS, slot_len, DQ)).astype(np.float32)
    pool_v = rng.normal(0, 1, (slots, HEADS, slot_len, DV)).astype(np.float32)
    pool_k[2, :, :keys], pool_v[2, :, :keys] = k, v
    first_row = 2 * HEADS * slot_len
    got = run(attention_op, q, (0, rows * DQ, DQ, DQ), pool_k.reshape(-1, DQ), (first_row * DQ, slot_len * DQ, DQ, DQ),
              pool_v.reshape(-1, DV), (first_row * DV, slot_len * DV, DV, DV), idx, table, (1.0, 0.1), rows)
    np.testing.assert_allclose(got, reference(q, k, v, idx, table, 1.0, 0.1), rtol=0, atol=2e-5)


def test_view_past_the_end_is_refused(attention_op):
    """A view that would read beyond its tensor fails the op instead of reading other memory."""
    rng = np.random.default_rng(5)
    q, k, v, table, idx = random_case(rng, 4, 10, False, False)
    with pytest.raises(RuntimeError, match="PointwiseAttention"):
        run(attention_op, q, (0, 4 * DQ, DQ, DQ), k, (DQ, 10 * DQ, DQ, DQ), v, (0, 10 * DV, DV, DV),
            idx, table, (1.0, 1.0), 4)


def test_two_key_segments_add_up_in_one_call(attention_op):
    """[past | new] keys as two segments (a pool slot and the projection output) in one call: the sum of the two
    single-segment results, each with its own index rows (past: suffix rows + a shared candidate row; new: a row
    each)."""
    from mindspore import Tensor

    rng = np.random.default_rng(6)
    rows, past_keys, new_keys, idx_rows = 40, 300, 40, 9
    q, k1, v1, table, idx1 = random_case(rng, rows, past_keys, False, False, idx_rows=idx_rows)
    _, k2, v2, _, idx2 = random_case(rng, rows, new_keys, False, True)
    like = np.zeros((rows, HEADS * DV), np.float32)
    q_at, scales = np.array((0, rows * DQ, DQ, DQ), np.int64), np.array((0.25, 1 / 64), np.float32)
    segments = []
    for k, v, idx, keys in ((k1, v1, idx1, past_keys), (k2, v2, idx2, new_keys)):
        segments += [k, np.array((0, keys * DQ, DQ, DQ), np.int64), v, np.array((0, keys * DV, DV, DV), np.int64),
                     idx.astype(np.int32)]
    got = attention_op(*(Tensor(a) for a in [q, q_at, *segments, table, scales, like])).asnumpy()
    want = reference(q, k1, v1, idx1, table, 0.25, 1 / 64) + reference(q, k2, v2, idx2, table, 0.25, 1 / 64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    # A second segment whose V is narrower than the first's is refused, not read past its width.
    segments[7] = np.array((0, new_keys * DV, DV, DV - 1), np.int64)
    with pytest.raises(RuntimeError, match="PointwiseAttention"):
        attention_op(*(Tensor(a) for a in [q, q_at, *segments, table, scales, like])).asnumpy()
