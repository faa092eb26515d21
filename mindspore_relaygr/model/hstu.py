"""HSTU building blocks: the layer, the relative (position, time) bias and the query blocks of attention.

The cells hold the parameters and the helpers every backend shares; what differs between plain MindSpore
ops and the fused CPU kernels (bias state, projection, attention, residual update) is in model/backend.py.

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
PAD_COLUMNS = 16
ASSEMBLED = "_assembled"  # suffix of the parameters derived from others (not saved in checkpoints)


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
        # The kernels' form: 0, the thresholds, +inf (so bucket +-1 lookups never leave the array).
        self.kernel_thresholds = Tensor(np.concatenate([[0.0], thresholds, [np.inf]]).astype(np.float32))
        self.table = Parameter(
            initializer(Normal(0.02), (cfg.num_heads, self.mask_index), mstype.float32), name="rab_table"
        )
        self.mask_column = Tensor(np.full((cfg.num_heads, 1), MASKED_BIAS, np.float32))
        offsets = np.arange(cfg.num_heads, dtype=np.int32) * (self.mask_index + 1)
        self.head_offsets = Tensor(offsets.reshape(-1, 1, 1))
        params = [cfg.num_pos_buckets, cfg.time_bucket_scale, self.mask_index]
        self.kernel_params = Tensor(np.array(params, np.float32))

    def masked_table(self) -> Tensor:
        """The bias table with the mask column appended: [h, T + 1]."""
        return ops.concat((self.table, self.mask_column), axis=1)

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
    """U, V, Q, K = split(SiLU(W1 LayerNorm(x) + b1)); y = x + W2(LayerNorm(A V) * U).

    W1 is one [d, h * (2 dv + 2 dqk)] matmul over all tokens, giving y [n, W] with columns
    U | V | Q | K (head g of V at [h dv + g dv, ...)). The fused attention kernel reads Q, K and V
    from y in place through strided views; plain ops use head-major copies ([h, n, d]). The
    parameters stay per head (w_v [h, d, dv], ...), so checkpoints keep their layout; the fused_cpu backend
    reads W1 from a copy assembled once (`assemble_weights`), the plain one (training, export) assembles it in
    the graph (`per_head_w1`). The projection and the residual update are the backend's (model/backend.py).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, d = cfg.num_heads, cfg.d_model
        self.num_heads, self.d_v, self.d_qk = h, cfg.d_v, cfg.d_qk

        def weight(name: str, shape: tuple[int, ...]) -> Parameter:
            return Parameter(initializer(Normal(0.02), shape, mstype.float32), name=name)

        def bias(name: str, shape: tuple[int, ...]) -> Parameter:
            return Parameter(initializer("zeros", shape, mstype.float32), name=name)

        self.w_u = nn.Dense(d, h * cfg.d_v, weight_init=Normal(0.02))
        self.w_v, self.b_v = weight("w_v", (h, d, cfg.d_v)), bias("b_v", (h, 1, cfg.d_v))
        self.w_q, self.b_q = weight("w_q", (h, d, cfg.d_qk)), bias("b_q", (h, 1, cfg.d_qk))
        self.w_k, self.b_k = weight("w_k", (h, d, cfg.d_qk)), bias("b_k", (h, 1, cfg.d_qk))
        self.input_norm = nn.LayerNorm((d,))  # before the UVQK projection, as in the HSTU reference
        self.norm = nn.LayerNorm((h * cfg.d_v,))
        self.norm_eps = Tensor(np.array([self.norm.epsilon], np.float32))
        self.out = nn.Dense(h * cfg.d_v, d, weight_init=Normal(0.02))
        self.q_scale = 1.0 / math.sqrt(cfg.d_qk) if cfg.qk_scale is None else float(cfg.qk_scale)
        hv, hq = h * cfg.d_v, h * cfg.d_qk
        # y gets PAD_COLUMNS zero columns: a row stride of 2^k floats (4 KiB) would map every row of a
        # strided K/V tile to the same cache sets and slow the fused kernel down.
        self.width = 2 * hv + 2 * hq + PAD_COLUMNS
        self.pad_weight = Tensor(np.zeros((d, PAD_COLUMNS), np.float32))
        self.pad_bias = Tensor(np.zeros(PAD_COLUMNS, np.float32))
        # (first column, width per head) of each part of y
        self.parts = {"u": (0, cfg.d_v), "v": (hv, cfg.d_v), "q": (2 * hv, cfg.d_qk), "k": (2 * hv + hq, cfg.d_qk)}
        # W1 and b1 assembled once for the fused_cpu backend (see assemble_weights). Parameter names follow the
        # attribute names, so these end in ASSEMBLED, which keeps them out of checkpoints.
        self.w1_assembled = Parameter(initializer("zeros", (d, self.width), mstype.float32), requires_grad=False)
        self.b1_assembled = Parameter(initializer("zeros", (self.width,), mstype.float32), requires_grad=False)

    @staticmethod
    def _columns(w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head weight [h, d, e] and bias [h, 1, e] -> [d, h * e] and [h * e] (column = head * e + j)."""
        h, d, e = w.shape
        return ops.reshape(ops.transpose(w, (1, 0, 2)), (d, h * e)), ops.reshape(b, (h * e,))

    def assemble_weights(self) -> None:
        """Copy the per-head parameters into the assembled W1 [d, W] and b1 [W] that FusedCpuOps.project reads.

        Its graphs then skip the per-call transposes and concats (about 1 ms per ranking request at
        d=256, 4 layers); call it again whenever the per-head parameters change.
        """
        w, b = self.per_head_w1()  # run eagerly, once
        self.w1_assembled.set_data(w)
        self.b1_assembled.set_data(b)

    def per_head_w1(self) -> tuple[Tensor, Tensor]:
        """W1 [d, W] and b1 [W] built from the per-head parameters (columns U | V | Q | K | padding)."""
        wv, bv = self._columns(self.w_v, self.b_v)
        wq, bq = self._columns(self.w_q, self.b_q)
        wk, bk = self._columns(self.w_k, self.b_k)
        w = ops.concat((ops.transpose(self.w_u.weight, (1, 0)), wv, wq, wk, self.pad_weight), axis=1)
        b = ops.concat((self.w_u.bias, bv, bq, bk, self.pad_bias))
        return w, b

    def kv_spec(self, rows: int) -> Tensor:
        """ProjectSiluColumns' spec: rows [0, rows) get the V and K column ranges only."""
        (v_first, v_width), (k_first, k_width) = self.parts["v"], self.parts["k"]
        return Tensor([rows, v_first, v_first + self.num_heads * v_width, k_first, k_first + self.num_heads * k_width],
                      mstype.int64)

    def part(self, y: Tensor, name: str) -> Tensor:
        """Token-major columns of one part of y: [n, h * width]."""
        first, width = self.parts[name]
        return take(y, first, first + self.num_heads * width, 1)

    def heads(self, y: Tensor, name: str) -> Tensor:
        """One part of y head-major: [h, n, width] (Q is not scaled here)."""
        width = self.parts[name][1]
        return ops.transpose(ops.reshape(self.part(y, name), (y.shape[0], self.num_heads, width)), (1, 0, 2))

    def view_at(self, name: str, first_row: int = 0) -> Tensor:
        """The fused kernel's view of one part of y [n, W] from row `first_row`: (offset, head stride,
        row stride, width) in elements."""
        first, width = self.parts[name]
        return Tensor([first_row * self.width + first, width, self.width, width], mstype.int64)

    def rows_at(self, name: str) -> Tensor:
        """One part of y [n, W] as the per-head rows the pool stores: (offset, head stride, row stride, width,
        heads) in elements, for the fused_cpu backend's slot write (FusedCpuOps.write_prefix)."""
        first, width = self.parts[name]
        return Tensor([first, width, self.width, width, self.num_heads], mstype.int64)

    def self_attention(self, y: Tensor, self_bias: Tensor, inv_norm: float) -> Tensor:
        """M-FALCON: each candidate also attends to itself: SiLU(q.k * scale + rab(0, 0)) v / N_norm, [M, h*dv]."""
        m, h = y.shape[0], self.num_heads
        q = ops.reshape(self.part(y, "q"), (m, h, self.d_qk))
        k = ops.reshape(self.part(y, "k"), (m, h, self.d_qk))
        v = ops.reshape(self.part(y, "v"), (m, h, self.d_v))
        weights = ops.silu(ops.sum(q * k, -1) * self.q_scale + self_bias)  # [M, h]
        return ops.reshape(ops.expand_dims(weights, -1) * v * inv_norm, (m, h * self.d_v))


def shape_carrier(*shape: int) -> Tensor:
    """A graph constant whose only use is its shape (a kernel's output shape): no op runs to make it."""
    return Tensor(np.zeros(shape, np.int8))


def take(x: Tensor, start: int, stop: int, axis: int = 0) -> Tensor:
    """x[..., start:stop, ...] along `axis` via Slice (StridedSlice is very slow on CPU)."""
    begin = [0] * x.ndim
    size = list(x.shape)
    begin[axis], size[axis] = start, stop - start
    return ops.slice(x, tuple(begin), tuple(size))


def query_blocks(num_rows: int, block_len: int) -> list[tuple[int, int]]:
    """Static [start, end) row ranges of the query blocks of `num_rows` new tokens."""
    return [(s, min(s + block_len, num_rows)) for s in range(0, num_rows, block_len)]
