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
        self.fused_window_op = None
        self.fused_weights_op = None
        self.fused_attention_op = None

    def enable_fused(self, fused_ops) -> None:
        """Attach the fused CPU kernels (model/kernels.py); graphs built with fused=True use them."""
        self.fused_index_op = fused_ops.rab_index
        self.fused_window_op = fused_ops.rab_index_window
        self.fused_weights_op = fused_ops.bias_silu
        self.fused_attention_op = fused_ops.attention

    def reads_views(self, fused: bool) -> bool:
        """True when attention reads Q/K/V in place through strided views (the fused attention kernel)."""
        return fused and self.fused_attention_op is not None

    def masked_table(self) -> Tensor:
        """The bias table with the mask column appended: [h, T + 1]."""
        return ops.concat((self.table, self.mask_column), axis=1)

    def prepare(self, fused: bool, q_meta: tuple, k_meta: tuple) -> Tensor:
        """Per-request bias state of one query block, reused by every layer.

        Reference path: the bias values [h, B, K]. Fused path: the bucket indices [B, K].
        """
        if fused:
            return self.fused_index_op(*q_meta[:3], *k_meta, self.pos_lut, self.fused_thresholds, self.fused_params)
        return self.gather(self.index(*q_meta, *k_meta))

    def prepare_window(self, q_meta: tuple, q_rows: tuple[int, int], k_meta: tuple, k_rows: tuple[int, int]) -> Tensor:
        """Fused bucket indices [B, K] of queries q_rows = [start, stop) of q_meta over keys k_rows of k_meta,
        read in place: no slices of the metadata first (one op where a block would otherwise need eight)."""
        (q0, q1), (k0, k1) = q_rows, k_rows
        return self.fused_window_op(*q_meta[:3], *k_meta, self.pos_lut, self.fused_thresholds, self.fused_params,
                                    Tensor([q0, k0], mstype.int64), shape_carrier(q1 - q0), shape_carrier(k1 - k0))

    def weights(self, fused: bool, scores: Tensor, prepared: Tensor) -> Tensor:
        """SiLU(scores + rab) for one query block, scores [h, B, K]."""
        if fused:
            return self.fused_weights_op(scores, prepared, self.masked_table())
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
    """U, V, Q, K = split(SiLU(W1 LayerNorm(x) + b1)); y = x + W2(LayerNorm(A V) * U).

    W1 is one [d, h * (2 dv + 2 dqk)] matmul over all tokens, giving y [n, W] with columns
    U | V | Q | K (head g of V at [h dv + g dv, ...)). The fused attention kernel reads Q, K and V
    from y in place through strided views; the reference ops use head-major copies ([h, n, d]). The
    parameters stay per head (w_v [h, d, dv], ...), so checkpoints keep their layout; inference graphs
    read W1 from a copy assembled once (`assemble_weights`), training and export assemble it in the graph.
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
        self.project_op = self.project_columns_op = self.finish_op = None  # fused dense kernels (enable_fused)
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
        # W1 and b1 assembled once for the inference graphs (see assemble_weights). Parameter names follow the
        # attribute names, so these end in ASSEMBLED, which keeps them out of checkpoints.
        self.w1_assembled = Parameter(initializer("zeros", (d, self.width), mstype.float32), requires_grad=False)
        self.b1_assembled = Parameter(initializer("zeros", (self.width,), mstype.float32), requires_grad=False)

    @staticmethod
    def _columns(w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head weight [h, d, e] and bias [h, 1, e] -> [d, h * e] and [h * e] (column = head * e + j)."""
        h, d, e = w.shape
        return ops.reshape(ops.transpose(w, (1, 0, 2)), (d, h * e)), ops.reshape(b, (h * e,))

    def assemble_weights(self) -> None:
        """Copy the per-head parameters into the assembled W1 [d, W] and b1 [W] that `project(x, True)` uses.

        Inference graphs then skip the per-call transposes and concats (about 1 ms per ranking request at
        d=256, 4 layers); call it again whenever the per-head parameters change.
        """
        w, b = self._per_head_w1()  # run eagerly, once
        self.w1_assembled.set_data(w)
        self.b1_assembled.set_data(b)

    def _per_head_w1(self) -> tuple[Tensor, Tensor]:
        """W1 [d, W] and b1 [W] built from the per-head parameters (columns U | V | Q | K | padding)."""
        wv, bv = self._columns(self.w_v, self.b_v)
        wq, bq = self._columns(self.w_q, self.b_q)
        wk, bk = self._columns(self.w_k, self.b_k)
        w = ops.concat((ops.transpose(self.w_u.weight, (1, 0)), wv, wq, wk, self.pad_weight), axis=1)
        b = ops.concat((self.w_u.bias, bv, bq, bk, self.pad_bias))
        return w, b

    def project(self, x: Tensor, assembled: bool = False, kv_only_rows: int = 0) -> Tensor:
        """x [n, d] -> y = SiLU(W1 LayerNorm(x) + b1) [n, W], columns U | V | Q | K | padding.

        assembled=True reads W1/b1 from `assemble_weights` (inference); False builds them from the per-head
        parameters in the graph, so gradients reach those (training, export). kv_only_rows = r > 0 (a last
        layer, whose token outputs feed nothing): the fused kernel computes only the V and K columns of rows
        [0, r) and leaves zeros in their U and Q columns; the other paths compute every column.
        """
        x = self.input_norm(x)
        if assembled:
            if kv_only_rows > 0 and self.project_columns_op is not None:
                return self.project_columns_op(x, self.w1_assembled, self.b1_assembled, self._kv_spec(kv_only_rows))
            if self.project_op is not None:
                return self.project_op(x, self.w1_assembled, self.b1_assembled)
            return ops.silu(ops.bias_add(ops.matmul(x, self.w1_assembled), self.b1_assembled))
        w, b = self._per_head_w1()
        return ops.silu(ops.bias_add(ops.matmul(x, w), b))

    def _kv_spec(self, rows: int) -> Tensor:
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
        heads) in elements, for KVPool.write_views."""
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

    def enable_fused(self, fused_ops) -> None:
        """Attach the fused dense kernels (model/kernels.py), used by `project(x, True)` and `finish(..., True)`."""
        self.project_op = fused_ops.project_silu
        self.project_columns_op = fused_ops.project_silu_columns
        self.finish_op = fused_ops.finish_rows

    def finish(self, x: Tensor, av_rows: Tensor, u: Tensor, fused: bool = False) -> Tensor:
        """Residual update from the attention output av_rows [n, h*dv] (token-major) and the gate u."""
        if fused and self.finish_op is not None:
            return self.finish_op(x, av_rows, u, self.norm.gamma, self.norm.beta, self.out.weight, self.out.bias,
                                  self.norm_eps)
        return x + self.out(self.norm(av_rows) * u)


_bmm_nt = ops.BatchMatMul(transpose_b=True)


def pointwise_attention(rab: RelativeBias, fused: bool, query: tuple, kv: tuple, prepared: Tensor, like: Tensor,
                        scales: Tensor, inv_norm: float, more: tuple = ()) -> Tensor:
    """SiLU(q k^T + rab) v / N_norm for one query block -> [B, h*dv], token-major.

    query = (Q, at); kv = (K, K at, V, V at). at = None: the tensor itself, head-major ([h, B, dqk]
    with Q already scaled, [h, N, d] keys); otherwise an int64 [4] strided view (offset, head stride,
    row stride, width) that the fused kernel reads in place (Q scaled by scales[0] inside).
    The number of keys is the width of `prepared` (bias [h, B, K] or bucket indices [B, K]); K/V may
    hold more rows (the kernel reads the first K, the reference ops slice them). `like` [B, h*dv] gives
    the kernel its output shape. `more`: further (kv, prepared) key segments, whose attention is added (no
    softmax normaliser): the kernel runs all segments in one call.
    """
    q, q_at = query
    keys, k_at, values, v_at = kv
    if q_at is not None:
        segments = (keys, k_at, values, v_at, prepared)
        for seg_kv, seg_prepared in more:
            segments += (*seg_kv, seg_prepared)
        return rab.fused_attention_op(q, q_at, *segments, rab.masked_table(), scales, like)
    if more:
        out = pointwise_attention(rab, fused, query, kv, prepared, like, scales, inv_norm)
        for seg_kv, seg_prepared in more:
            out = out + pointwise_attention(rab, fused, query, seg_kv, seg_prepared, like, scales, inv_norm)
        return out
    num_keys = prepared.shape[-1]
    if keys.shape[1] != num_keys:
        keys, values = take(keys, 0, num_keys, 1), take(values, 0, num_keys, 1)
    out = ops.bmm(rab.weights(fused, _bmm_nt(q, keys), prepared), values) * inv_norm
    return ops.reshape(ops.transpose(out, (1, 0, 2)), (out.shape[1], -1))


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
