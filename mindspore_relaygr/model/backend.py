"""The model backend: the ops that differ between plain MindSpore ops and the fused CPU kernels.

A model picks one backend when it is built (`select_backend`) and every graph it compiles holds that one
object, as the HSTU reference picks one kernel implementation per module. The layers, the relative bias and
the KV pool keep their parameters and the helpers both backends share; the backend's methods take those
cells as arguments and hold everything that differs: the relative-bias state of a query block, the UVQK
projection, attention, the residual update, and reading and writing a pool slot.

- `PlainOps` ("plain"): MindSpore ops only, the path Ascend runs. It has gradients, so training and MindIR
  export use it. Projections build W1 from the per-head parameters in the graph; attention works on
  head-major Q/K/V copies and gathered slot rows.
- `FusedCpuOps` ("fused_cpu"): the fused CPU kernels (model/kernels.py), all of them. Projections read the W1
  assembled once (`HSTULayer.assemble_weights`); attention reads Q/K/V and pool slots in place through strided
  views (`reads_views`), and a prefix's K/V go from the projection outputs straight into the pool.

`reads_views` is a class constant, so graph code branches on it at compile time.
"""

from __future__ import annotations

import logging

from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model import kernels
from mindspore_relaygr.model.hstu import HSTULayer, RelativeBias, shape_carrier, take
from mindspore_relaygr.model.pool import KVPool

logger = logging.getLogger(__name__)

_bmm_nt = ops.BatchMatMul(transpose_b=True)


class PlainOps(nn.Cell):
    """MindSpore ops: bias values, per-head W1 built in the graph, head-major attention, gathered slots."""

    name = "plain"
    reads_views = False  # attention takes head-major tensors; a slot's K/V are gathered by row ids

    def prepare(self, rab: RelativeBias, q_meta: tuple, k_meta: tuple) -> Tensor:
        """Bias state of one query block, built once per request and read by every layer: the bias values
        [h, B, K] of queries q_meta = (pos, hi, lo) over keys k_meta = (pos, hi, lo, valid)."""
        return rab.gather(rab.index(*q_meta, *k_meta))

    def project(self, layer: HSTULayer, x: Tensor, kv_only_rows: int = 0) -> Tensor:
        """x [n, d] -> y = SiLU(W1 LayerNorm(x) + b1) [n, W], W1/b1 built from the per-head parameters (so
        gradients reach them); every column of every row (kv_only_rows only saves work in FusedCpuOps)."""
        x = layer.input_norm(x)
        w, b = layer.per_head_w1()
        return ops.silu(ops.bias_add(ops.matmul(x, w), b))

    def finish(self, layer: HSTULayer, x: Tensor, av_rows: Tensor, u: Tensor) -> Tensor:
        """Residual update x + W2(LayerNorm(A V) * U) from the attention output av_rows [n, h*dv] (token-major)."""
        return x + layer.out(layer.norm(av_rows) * u)

    def attention(self, rab: RelativeBias, query: tuple, kv: tuple, prepared: Tensor, like: Tensor | None,
                  scales: Tensor, inv_norm: float, more: tuple = ()) -> Tensor:
        """SiLU(q k^T + rab) v / N_norm for one query block -> [B, h*dv], token-major.

        query = (Q [h, B, dqk] already scaled, None); kv = (K [h, N, dqk], None, V [h, N, dv], None);
        prepared = the bias [h, B, K] (`prepare`), whose width K is the number of keys (K/V may hold more rows:
        the first K are used). `more`: further (kv, prepared) key segments, whose attention is added (no softmax
        normaliser). `like` and `scales` are the fused kernel's (unused here).
        """
        q = query[0]
        out = self._segment(q, kv, prepared, inv_norm)
        for seg_kv, seg_prepared in more:
            out = out + self._segment(q, seg_kv, seg_prepared, inv_norm)
        return out

    @staticmethod
    def _segment(q: Tensor, kv: tuple, bias: Tensor, inv_norm: float) -> Tensor:
        keys, _, values, _ = kv
        num_keys = bias.shape[-1]
        if keys.shape[1] != num_keys:
            keys, values = take(keys, 0, num_keys, 1), take(values, 0, num_keys, 1)
        out = ops.bmm(ops.silu(_bmm_nt(q, keys) + bias), values) * inv_norm
        return ops.reshape(ops.transpose(out, (1, 0, 2)), (out.shape[1], -1))

    def read_past(self, pool: KVPool, kv_ids: Tensor, time_ids: Tensor, past_pos: Tensor, past_valid: Tensor):
        """The `past` of HSTUNet.encode from a slot: its K/V gathered per layer (kv_ids = PoolLayout.read_ids)."""
        keys, values, hi, lo = pool.read(kv_ids, time_ids)
        views = tuple((keys[i], None, values[i], None) for i in range(len(keys)))  # graph mode: no zip(strict=)
        return views, past_pos, hi, lo, past_valid

    def write_prefix(self, pool: KVPool, layer: HSTULayer, kv_ids: Tensor, time_ids: Tensor, keys: tuple,
                     values: tuple, hi: Tensor, lo: Tensor) -> Tensor:
        """Write a prefix's K and V (head-major per layer, from HSTUNet.encode) and times into the pool rows
        kv_ids / time_ids, in place (scatter_update)."""
        width_k, width_v = keys[0].shape[-1], values[0].shape[-1]
        return pool.write(kv_ids, time_ids, ops.reshape(ops.stack(keys), (-1, width_k)),
                          ops.reshape(ops.stack(values), (-1, width_v)), hi, lo)


class FusedCpuOps(nn.Cell):
    """The fused CPU kernels: bias bucket indices, assembled W1, attention through strided views, in-place
    slot writes."""

    name = "fused_cpu"
    reads_views = True  # attention reads Q/K/V from the projection outputs and the pool in place

    def __init__(self, kernel_ops: kernels.FusedOps) -> None:
        super().__init__()
        self.rab_index = kernel_ops.rab_index
        self.rab_index_window = kernel_ops.rab_index_window
        self.attention_op = kernel_ops.attention
        self.project_silu = kernel_ops.project_silu
        self.project_silu_columns = kernel_ops.project_silu_columns
        self.finish_rows = kernel_ops.finish_rows
        self.scatter_view_rows = kernel_ops.scatter_view_rows

    def prepare(self, rab: RelativeBias, q_meta: tuple, k_meta: tuple) -> Tensor:
        """Bias state of one query block, built once per request and read by every layer: the bucket indices
        [B, K] of queries q_meta = (pos, hi, lo, ...) over keys k_meta = (pos, hi, lo, valid)."""
        return self.rab_index(*q_meta[:3], *k_meta, rab.pos_lut, rab.kernel_thresholds, rab.kernel_params)

    def prepare_window(self, rab: RelativeBias, q_meta: tuple, q_rows: tuple[int, int], k_meta: tuple,
                       k_rows: tuple[int, int]) -> Tensor:
        """Bucket indices [B, K] of queries q_rows = [start, stop) of q_meta over keys k_rows of k_meta, read in
        place: no slices of the metadata first (one op where a block would otherwise need eight)."""
        (q0, q1), (k0, k1) = q_rows, k_rows
        return self.rab_index_window(*q_meta[:3], *k_meta, rab.pos_lut, rab.kernel_thresholds, rab.kernel_params,
                                     Tensor([q0, k0], mstype.int64), shape_carrier(q1 - q0), shape_carrier(k1 - k0))

    def project(self, layer: HSTULayer, x: Tensor, kv_only_rows: int = 0) -> Tensor:
        """x [n, d] -> y = SiLU(W1 LayerNorm(x) + b1) [n, W] with the assembled W1/b1. kv_only_rows = r > 0 (a
        last layer, whose token outputs feed nothing): only the V and K columns of rows [0, r), zeros in their U
        and Q columns."""
        x = layer.input_norm(x)
        if kv_only_rows > 0:
            return self.project_silu_columns(x, layer.w1_assembled, layer.b1_assembled, layer.kv_spec(kv_only_rows))
        return self.project_silu(x, layer.w1_assembled, layer.b1_assembled)

    def finish(self, layer: HSTULayer, x: Tensor, av_rows: Tensor, u: Tensor) -> Tensor:
        """Residual update x + W2(LayerNorm(A V) * U) from the attention output av_rows [n, h*dv], in one op."""
        return self.finish_rows(x, av_rows, u, layer.norm.gamma, layer.norm.beta, layer.out.weight, layer.out.bias,
                                layer.norm_eps)

    def attention(self, rab: RelativeBias, query: tuple, kv: tuple, prepared: Tensor, like: Tensor,
                  scales: Tensor, inv_norm: float, more: tuple = ()) -> Tensor:
        """SiLU(q k^T + rab) v / N_norm for one query block -> [B, h*dv], token-major, in one kernel call.

        query = (y, at), kv = (K, K at, V, V at): each tensor with an int64 [4] strided view (offset, head
        stride, row stride, width) that the kernel reads in place (HSTULayer.view_at, KVPool.layer_views); Q is
        scaled by scales[0] inside, N_norm = 1 / scales[1]. prepared = the bucket indices [B, K] (`prepare`);
        `like` [B, h*dv] gives the output shape. `more`: further (kv, prepared) key segments, summed in the
        same call.
        """
        q, q_at = query
        keys, k_at, values, v_at = kv
        segments = (keys, k_at, values, v_at, prepared)
        for seg_kv, seg_prepared in more:
            segments += (*seg_kv, seg_prepared)
        return self.attention_op(q, q_at, *segments, rab.masked_table(), scales, like)

    def read_past(self, pool: KVPool, kv_ids: Tensor, time_ids: Tensor, past_pos: Tensor, past_valid: Tensor):
        """The `past` of HSTUNet.encode from a slot: views into the pool (kv_ids = PoolLayout.read_views)."""
        views = pool.layer_views(kv_ids)
        hi, lo = pool.read_times(time_ids)
        return views, past_pos, hi, lo, past_valid

    def write_prefix(self, pool: KVPool, layer: HSTULayer, kv_ids: Tensor, time_ids: Tensor, keys: tuple,
                     values: tuple, hi: Tensor, lo: Tensor) -> Tensor:
        """Write a prefix's K and V and times into the pool rows kv_ids / time_ids. keys = values = each layer's
        projection output y [n, W] (HSTUNet.encode): one kernel copies their per-head K (V) rows into the pool
        Parameter in place, instead of head transposes, a stack and a scatter."""
        return pool.with_times(self.scatter_view_rows(pool.keys, kv_ids, layer.rows_at("k"), *keys),
                               self.scatter_view_rows(pool.values, kv_ids, layer.rows_at("v"), *values),
                               time_ids, hi, lo)


Backend = PlainOps | FusedCpuOps


def select_backend(model_cfg: ModelConfig, device_target: str) -> Backend:
    """The backend a model runs, from `model.fused_kernels`: null = fused_cpu on CPU when every fused kernel
    builds, plain otherwise; true = fused_cpu, a RuntimeError naming what is missing if it cannot be built;
    false = plain."""
    mode = model_cfg.fused_kernels
    if mode is False:
        logger.info("model backend: plain (model.fused_kernels=false)")
        return PlainOps()
    if device_target != "CPU":
        if mode:
            raise RuntimeError(f"model.fused_kernels=true, but the fused kernels are CPU kernels and the device "
                               f"target is {device_target}")
        logger.info("model backend: plain (device target %s; the fused kernels are CPU kernels)", device_target)
        return PlainOps()
    try:
        kernel_ops = kernels.require_fused_ops()
    except kernels.KernelsUnavailable as exc:
        if mode:
            raise RuntimeError(f"model.fused_kernels=true, but the fused CPU kernels are unavailable: {exc}") from exc
        logger.warning("model backend: plain (the fused CPU kernels are unavailable: %s)", exc)
        return PlainOps()
    logger.info("model backend: fused_cpu (every fused CPU kernel built)")
    return FusedCpuOps(kernel_ops)
