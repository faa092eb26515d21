"""HSTU building blocks: the layer, the relative (position, time) bias and blocked attention.

Shapes use n = new tokens, K = keys visible to a query block, h = heads, d = d_model.
Timestamps travel as float32 pairs (hi, lo) = (t // 65536, t % 65536) so that differences of
absolute unix seconds stay exact in fp32 without any per-request time origin.
"""

from __future__ import annotations

import math

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import Normal, initializer

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model import inputs

TIME_HI_UNIT = float(inputs.TIME_HI_UNIT)
MASKED_BIAS = -1.0e9  # SiLU(x - 1e9) is exactly 0 in fp32: masked pairs contribute nothing


def time_thresholds(num_buckets: int, scale: float) -> np.ndarray:
    """Smallest fp32 dt of each time bucket k >= 1: bucket(dt) = #{k: dt >= thr_k} ~ floor(log1p(dt) * scale).

    Buckets are defined by these exact thresholds (not by a log kernel) so every path agrees bit-wise.
    """
    bounds = np.expm1(np.arange(1, num_buckets, dtype=np.float64) / scale)
    return np.nextafter(bounds.astype(np.float32), np.float32(np.inf)).astype(np.float32)


def position_buckets(num_buckets: int, max_seq_len: int) -> np.ndarray:
    """Bucket of every distance 0..max_seq_len: exact for small distances, log-spaced beyond."""
    exact = num_buckets // 2
    rel = np.arange(max_seq_len + 1, dtype=np.float64)
    scale = (num_buckets - 1 - exact) / max(np.log((max_seq_len + 1) / exact), 1e-9)
    logb = exact + np.floor(np.log(np.maximum(rel, 1) / exact) * scale)
    return np.where(rel < exact, rel, np.minimum(logb, num_buckets - 1)).astype(np.int32)


class RelativeBias(nn.Cell):
    """rab(pos, time): a learned [heads, time buckets * pos buckets] table shared by all layers.

    Sharing the table lets a graph build the bias of each query block once per request and reuse
    it in every layer. Masked pairs (padding, future keys) index an extra MASKED_BIAS column.
    Time bucket = floor(log1p(|dt|) * scale) on the exact fp32 difference of (hi, lo) timestamps.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_pos = cfg.num_pos_buckets
        self.max_rel = cfg.max_seq_len
        self.mask_index = cfg.num_pos_buckets * cfg.num_time_buckets
        self.pos_lut = Tensor(position_buckets(cfg.num_pos_buckets, cfg.max_seq_len))
        thresholds = time_thresholds(cfg.num_time_buckets, cfg.time_bucket_scale)
        self.time_bounds = [float(t) for t in thresholds]
        # Fused kernel form: 0, the thresholds, +inf (so bucket +-1 lookups never leave the array).
        self.fused_thresholds = Tensor(np.concatenate([[0.0], thresholds, [np.inf]]).astype(np.float32))
        self.table = Parameter(
            initializer(Normal(0.02), (cfg.num_heads, self.mask_index), mstype.float32), name="rab_table"
        )
        self.mask_column = Tensor(np.full((cfg.num_heads, 1), MASKED_BIAS, np.float32))
        offsets = np.arange(cfg.num_heads, dtype=np.int32) * (self.mask_index + 1)
        self.head_offsets = Tensor(offsets.reshape(-1, 1, 1))
        params = [cfg.num_pos_buckets, cfg.time_bucket_scale, self.mask_index]
        self.fused_params = Tensor(np.array(params, np.float32))
        self.fused_index_op = None
        self.fused_weights_op = None

    def enable_fused(self, fused_ops) -> None:
        """Attach the fused CPU kernels (model/kernels.py); graphs built with fused=True use them."""
        self.fused_index_op = fused_ops.rab_index
        self.fused_weights_op = fused_ops.bias_silu

    def prepare(self, fused: bool, q_meta: tuple, k_meta: tuple) -> Tensor:
        """Per-request bias state of one query block, reused by every layer.

        Reference path: the bias values [h, B, K]. Fused path: the bucket indices [B, K].
        """
        if fused:
            return self.fused_index_op(*q_meta[:3], *k_meta, self.pos_lut, self.fused_thresholds, self.fused_params)
        return self.gather(self.index(*q_meta, *k_meta))

    def weights(self, fused: bool, scores: Tensor, prepared: Tensor) -> Tensor:
        """SiLU(scores + rab) for one query block, scores [h, B, K]."""
        if fused:
            return self.fused_weights_op(scores, prepared, ops.concat((self.table, self.mask_column), axis=1))
        return ops.silu(scores + prepared)

    def index(self, q_pos: Tensor, q_hi: Tensor, q_lo: Tensor, k_pos: Tensor, k_hi: Tensor, k_lo: Tensor,
              k_valid: Tensor) -> Tensor:
        """Bucket index [B, K] of every (query, key) pair; invalid or future keys -> mask index."""
        rel = ops.expand_dims(q_pos, 1) - ops.expand_dims(k_pos, 0)  # int32
        pos_bucket = ops.gather(self.pos_lut, ops.clip_by_value(rel, 0, self.max_rel), 0)
        hi = ops.expand_dims(q_hi, 1) - ops.expand_dims(k_hi, 0)
        lo = ops.expand_dims(q_lo, 1) - ops.expand_dims(k_lo, 0)
        dt = ops.abs(hi * TIME_HI_UNIT + lo)
        time_bucket = ops.bucketize(dt, self.time_bounds, right=True)
        visible = ops.logical_and(ops.expand_dims(k_valid, 0), rel >= 0)
        idx = time_bucket * self.num_pos + pos_bucket
        return ops.select(visible, idx, ops.full_like(idx, self.mask_index))

    def gather(self, idx: Tensor) -> Tensor:
        """[B, K] bucket indices -> [h, B, K] bias values, as one 1-D gather (cheapest on CPU)."""
        flat = ops.reshape(ops.concat((self.table, self.mask_column), axis=1), (-1,))
        return ops.gather(flat, ops.expand_dims(idx, 0) + self.head_offsets, 0)

    def self_bias(self) -> Tensor:
        """Bias of a token attending to itself (distance 0, time 0): [h, 1]."""
        return ops.slice(self.table, (0, 0), (self.num_heads, 1))


class HSTULayer(nn.Cell):
    """U, V, Q, K = split(SiLU(W1 x + b1)); y = x + W2(LayerNorm(A V) * U).

    V, Q and K are projected per head with batched matmuls, so they come out head-major
    ([h, n, d]) without a transpose; U stays token-major for the output gate.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, d = cfg.num_heads, cfg.d_model
        self.num_heads = h

        def weight(name: str, shape: tuple[int, ...]) -> Parameter:
            return Parameter(initializer(Normal(0.02), shape, mstype.float32), name=name)

        def bias(name: str, shape: tuple[int, ...]) -> Parameter:
            return Parameter(initializer("zeros", shape, mstype.float32), name=name)

        self.w_u = nn.Dense(d, h * cfg.d_v, weight_init=Normal(0.02))
        self.w_v, self.b_v = weight("w_v", (h, d, cfg.d_v)), bias("b_v", (h, 1, cfg.d_v))
        self.w_q, self.b_q = weight("w_q", (h, d, cfg.d_qk)), bias("b_q", (h, 1, cfg.d_qk))
        self.w_k, self.b_k = weight("w_k", (h, d, cfg.d_qk)), bias("b_k", (h, 1, cfg.d_qk))
        self.norm = nn.LayerNorm((h * cfg.d_v,))
        self.out = nn.Dense(h * cfg.d_v, d, weight_init=Normal(0.02))
        self.q_scale = 1.0 / math.sqrt(cfg.d_qk)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [n, d] -> u [n, h*dv], v [h, n, dv], q [h, n, dqk] (pre-scaled), k [h, n, dqk]."""
        u = ops.silu(self.w_u(x))
        xb = ops.broadcast_to(ops.expand_dims(x, 0), (self.num_heads,) + x.shape)  # once, not per matmul
        v = ops.silu(ops.bmm(xb, self.w_v) + self.b_v)
        q = ops.silu(ops.bmm(xb, self.w_q) + self.b_q) * self.q_scale
        k = ops.silu(ops.bmm(xb, self.w_k) + self.b_k)
        return u, v, q, k

    def finish(self, x: Tensor, av: Tensor, u: Tensor) -> Tensor:
        """Residual update from the attention output av [h, n, dv] and the gate u [n, h*dv]."""
        n = av.shape[1]
        av_rows = ops.reshape(ops.transpose(av, (1, 0, 2)), (n, -1))
        return x + self.out(self.norm(av_rows) * u)


_bmm_nt = ops.BatchMatMul(transpose_b=True)


def pointwise_attention(rab: RelativeBias, fused: bool, q: Tensor, k: Tensor, v: Tensor, prepared: Tensor,
                        inv_norm: float) -> Tensor:
    """SiLU(q k^T + rab) v / N_norm for one query block: [h,B,dqk] x [h,K,dqk] -> [h,B,dv]."""
    return ops.bmm(rab.weights(fused, _bmm_nt(q, k), prepared), v) * inv_norm


def take(x: Tensor, start: int, stop: int, axis: int = 0) -> Tensor:
    """x[..., start:stop, ...] along `axis` via Slice (StridedSlice is very slow on CPU)."""
    begin = [0] * x.ndim
    size = list(x.shape)
    begin[axis], size[axis] = start, stop - start
    return ops.slice(x, tuple(begin), tuple(size))


def query_blocks(num_rows: int, block_len: int) -> list[tuple[int, int]]:
    """Static [start, end) row ranges of the query blocks of `num_rows` new tokens."""
    return [(s, min(s + block_len, num_rows)) for s in range(0, num_rows, block_len)]
