"""The HSTU ranker network and its three graphs (`full`, `prefix`, `candidate`).

All graphs share one `HSTUNet` (the weights) and the prefix/candidate graphs share one `KVPool`.
`HSTUNet.encode` is the single forward routine: new tokens attend to optional past K/V (a cached
prefix) and to each other causally; candidates attend to everything before them and to themselves
only (M-FALCON). Each graph is that routine with different inputs and outputs.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import Normal, initializer

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model.hstu import HSTULayer, RelativeBias, pointwise_attention, query_blocks, take
from mindspore_relaygr.model.pool import KVPool


class HSTUNet(nn.Cell):
    """Embeddings, HSTU layers, the shared relative bias and the multi-task head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.item_table = Parameter(initializer(Normal(0.02), (cfg.num_items + 1, d), mstype.float32),
                                    name="item_table")
        # Two extra actions: the user/context token and "candidate".
        self.action_table = Parameter(initializer(Normal(0.02), (cfg.num_actions + 2, d), mstype.float32),
                                      name="action_table")
        self.user_table = Parameter(
            initializer(Normal(0.02), (max(1, sum(cfg.user_feature_sizes)), d), mstype.float32),
            name="user_table")
        self.layers = nn.CellList([HSTULayer(cfg) for _ in range(cfg.num_layers)])
        self.rab = RelativeBias(cfg)
        self.final_norm = nn.LayerNorm((d,))
        self.head = nn.Dense(d, len(cfg.task_names), weight_init=Normal(0.02))
        self.inv_norm = 1.0 / cfg.max_seq_len  # constant N_norm (see ModelConfig.max_seq_len)
        # (q scale, 1 / N_norm) for the fused kernel, which applies both inside its GEMMs
        self.attention_scales = Tensor(np.array([self.layers[0].q_scale, self.inv_norm], np.float32))
        self.block_len = cfg.attention_block_len
        self.candidate_action = cfg.num_actions + 1

    def embed(self, item_ids: Tensor, action_ids: Tensor) -> Tensor:
        return ops.gather(self.item_table, item_ids, 0) + ops.gather(self.action_table, action_ids, 0)

    def add_user_token(self, x: Tensor, user_feats: Tensor, user_row: Tensor) -> Tensor:
        """Add the summed user-feature embeddings to the rows where user_row == 1."""
        user = ops.sum(ops.gather(self.user_table, user_feats, 0), 0, keepdim=True)
        return x + ops.expand_dims(user_row, 1) * user

    def embed_candidates(self, cand_ids: Tensor) -> Tensor:
        action = take(self.action_table, self.candidate_action, self.candidate_action + 1)
        return ops.gather(self.item_table, cand_ids, 0) + action

    def logits(self, cand_hidden: Tensor) -> Tensor:
        return self.head(self.final_norm(cand_hidden))

    def encode(self, x, meta, past, cand, cand_meta, fused):
        """Run all layers.

        x [n, d] new tokens; meta = (pos [n] int32, time hi [n], time lo [n], valid [n] bool).
        past = None or (K/V per layer, pos [P], hi [P], lo [P], valid [P]); K/V of a layer is
        (K, K at, V, V at) as in hstu.pointwise_attention (pool views, or head-major with at = None).
        cand = None or [M, d]; cand_meta = (pos [1], hi [1], lo [1]): all candidates share them.
        fused (a constant) picks the fused CPU kernels or the reference ops for the pointwise part.
        Pointwise attention has no softmax normaliser, so attention over [past | new] keys is the sum
        of the two parts: cached K/V are used as read, never concatenated.
        Returns (new K per layer [h, n, dqk], new V per layer [h, n, dv], candidate hidden or None).
        """
        views = self.rab.reads_views(fused)
        blocks = query_blocks(x.shape[0], self.block_len)
        past_meta = None if past is None else past[1:]
        # Bias is built once per request and reused by every layer; candidates share one row.
        block_bias = ()
        for s, e in blocks:
            q_meta = tuple(take(m, s, e) for m in meta[:3])
            new_bias = self.rab.prepare(fused, q_meta, tuple(take(m, 0, e) for m in meta))
            past_bias = None if past is None else self.rab.prepare(fused, q_meta, past_meta)
            block_bias += ((new_bias, past_bias),)
        cand_bias = None
        if cand is not None:
            cand_bias = (self.rab.prepare(fused, cand_meta, meta),
                         None if past is None else self.rab.prepare(fused, cand_meta, past_meta))
        self_bias = ops.transpose(self.rab.self_bias(), (1, 0))  # [1, h]
        # Ranking from a cached slot: the suffix rows and the candidates attend to the past keys in one
        # kernel call per layer (each layer's cached K/V is read once), suffix index rows first, then
        # the candidates' shared row.
        merged_past_idx = None
        if views and past is not None and cand is not None:
            merged_past_idx = ops.concat(tuple(bias[1] for bias in block_bias) + (cand_bias[1],))

        new_keys, new_values = (), ()
        last = len(self.layers) - 1
        for layer_id, layer in enumerate(self.layers):
            y = layer.project(x)
            k, v = layer.heads(y, "k"), layer.heads(y, "v")  # what the pool stores (unused ones are pruned)
            new_keys += (k,)
            new_values += (v,)
            new_kv = (y, layer.view_at("k"), y, layer.view_at("v")) if views else (k, None, v, None)
            past_kv = None if past is None else past[0][layer_id]
            rows_out = layer_id < last  # the last layer's token outputs feed nothing: only its K/V are used
            u = layer.part(y, "u") if rows_out else None
            yc = uc = merged_past = None
            if cand is not None:
                yc = layer.project(cand)
                uc = layer.part(yc, "u")
                if merged_past_idx is not None and rows_out:
                    merged_past = pointwise_attention(
                        self.rab, fused, (ops.concat((y, yc)), layer.view_at("q")), past_kv, merged_past_idx,
                        ops.concat((u, uc)), self.attention_scales, self.inv_norm)
                query = (yc, layer.view_at("q")) if views else (layer.heads(yc, "q") * layer.q_scale, None)
                past_c = None if merged_past is None else take(merged_past, x.shape[0], merged_past.shape[0])
                av_c = self._attend(fused, query, new_kv, past_kv, cand_bias, uc, past_c)
                av_c = av_c + layer.self_attention(yc, self_bias, self.inv_norm)
                cand = layer.finish(cand, av_c, uc)
            if rows_out:
                q_all = None if views else layer.heads(y, "q") * layer.q_scale
                av = ()
                for b, (s, e) in enumerate(blocks):
                    query = (y, layer.view_at("q", s)) if views else (take(q_all, s, e, 1), None)
                    past_b = None if merged_past is None else take(merged_past, s, e)
                    av += (self._attend(fused, query, new_kv, past_kv, block_bias[b], take(u, s, e), past_b),)
                x = layer.finish(x, ops.concat(av) if len(av) > 1 else av[0], u)
        return new_keys, new_values, cand

    def _attend(self, fused, query, new_kv, past_kv, bias, like, past_out=None):
        """Attention of a query block over new keys (causal; the bias says how many) plus, if any, the past
        (`past_out` when it was computed already)."""
        out = pointwise_attention(self.rab, fused, query, new_kv, bias[0], like, self.attention_scales,
                                  self.inv_norm)
        if past_out is not None:
            return out + past_out
        if past_kv is not None:
            out = out + pointwise_attention(self.rab, fused, query, past_kv, bias[1], like, self.attention_scales,
                                            self.inv_norm)
        return out


class FullGraph(nn.Cell):
    """All tokens -> candidate logits (training, reference and the baseline serving path)."""

    def __init__(self, net: HSTUNet, fused: bool = False) -> None:
        super().__init__()
        self.net, self.fused = net, fused

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  cand_ids, cand_pos, cand_hi, cand_lo):
        x = self.net.add_user_token(self.net.embed(item_ids, action_ids), user_feats, user_row)
        cand = self.net.embed_candidates(cand_ids)
        _, _, hidden = self.net.encode(x, (pos, hi, lo, valid), None, cand, (cand_pos, cand_hi, cand_lo),
                                       self.fused)
        return self.net.logits(hidden)


def _read_past(pool: KVPool, direct: bool, kv_ids, time_ids, past_pos, past_valid):
    """The `past` of HSTUNet.encode from a slot: views into the pool (fused kernel) or gathered K/V."""
    if direct:
        views = pool.layer_views(kv_ids)
        hi, lo = pool.read_times(time_ids)
    else:
        keys, values, hi, lo = pool.read(kv_ids, time_ids)
        views = tuple((keys[i], None, values[i], None) for i in range(len(keys)))  # graph mode: no zip(strict=)
    return views, past_pos, hi, lo, past_valid


class PrefixGraph(nn.Cell):
    """Prefix tokens (optionally extending a slot's cached tokens) -> K/V written in place."""

    def __init__(self, net: HSTUNet, pool: KVPool, with_past: bool, fused: bool = False) -> None:
        super().__init__()
        self.net, self.pool, self.with_past, self.fused = net, pool, with_past, fused
        self.direct = net.rab.reads_views(fused)

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  write_kv_ids, write_time_ids, past_kv_ids, past_time_ids, past_pos, past_valid):
        x = self.net.add_user_token(self.net.embed(item_ids, action_ids), user_feats, user_row)
        past = None
        if self.with_past:
            past = _read_past(self.pool, self.direct, past_kv_ids, past_time_ids, past_pos, past_valid)
        keys, values, _ = self.net.encode(x, (pos, hi, lo, valid), past, None, None, self.fused)
        width_k, width_v = keys[0].shape[-1], values[0].shape[-1]
        done = self.pool.write(write_kv_ids, write_time_ids, ops.reshape(ops.stack(keys), (-1, width_k)),
                               ops.reshape(ops.stack(values), (-1, width_v)), hi, lo)
        return ops.depend(ops.reduce_sum(ops.cast(valid, mstype.int32)), done)


class CandidateGraph(nn.Cell):
    """A cached slot + short-term suffix tokens + candidates -> candidate logits."""

    def __init__(self, net: HSTUNet, pool: KVPool, fused: bool = False) -> None:
        super().__init__()
        self.net, self.pool, self.fused = net, pool, fused
        self.direct = net.rab.reads_views(fused)

    def construct(self, item_ids, action_ids, pos, hi, lo, valid, past_kv_ids, past_time_ids, past_pos,
                  past_valid, cand_ids, cand_pos, cand_hi, cand_lo):
        x = self.net.embed(item_ids, action_ids)
        cand = self.net.embed_candidates(cand_ids)
        past = _read_past(self.pool, self.direct, past_kv_ids, past_time_ids, past_pos, past_valid)
        _, _, hidden = self.net.encode(x, (pos, hi, lo, valid), past, cand, (cand_pos, cand_hi, cand_lo),
                                       self.fused)
        return self.net.logits(hidden)


class SlotReadGraph(nn.Cell):
    """Rows of a slot -> (K [L, h, P, dqk], V [L, h, P, dv], hi [P], lo [P]): spill to host memory."""

    def __init__(self, pool: KVPool) -> None:
        super().__init__()
        self.pool = pool

    def construct(self, kv_ids, time_ids):
        return self.pool.read(kv_ids, time_ids)


class SlotWriteGraph(nn.Cell):
    """Host copies -> rows of a slot, in place: reload from host memory."""

    def __init__(self, pool: KVPool) -> None:
        super().__init__()
        self.pool = pool

    def construct(self, kv_ids, time_ids, keys, values, hi, lo):
        done = self.pool.write(kv_ids, time_ids, keys, values, hi, lo)
        return ops.depend(ops.reduce_sum(hi[:1]), done)
