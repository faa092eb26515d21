"""The HSTU ranker network and its three graphs (`full`, `prefix`, `candidate`).

All graphs share one `HSTUNet` (the weights) and the prefix/candidate graphs share one `KVPool`.
`HSTUNet.encode` is the single forward routine: new tokens attend to optional past K/V (a cached
prefix) and to each other causally; candidates attend to everything before them and to themselves
only (M-FALCON). Each graph is that routine with different inputs and outputs, on the model's one
backend (model/backend.py), which every graph holds.
"""

from __future__ import annotations

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore import dtype as mstype
from mindspore.common.initializer import Normal, initializer

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model.backend import Backend
from mindspore_relaygr.model.hstu import HSTULayer, RelativeBias, query_blocks, shape_carrier, take
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
        # Absolute positions (as the HSTU reference): a cached prefix's positions never depend on what follows.
        self.pos_table = Parameter(initializer(Normal(0.02), (cfg.max_seq_len + 1, d), mstype.float32),
                                   name="pos_table")
        self.max_pos = cfg.max_seq_len
        self.user_table = Parameter(
            initializer(Normal(0.02), (max(1, sum(cfg.user_feature_sizes)), d), mstype.float32),
            name="user_table")
        self.layers = nn.CellList([HSTULayer(cfg) for _ in range(cfg.num_layers)])
        self.rab = RelativeBias(cfg)
        self.final_norm = nn.LayerNorm((d,))
        # Task 0 (engage) is the cosine of the candidate's hidden state with its item embedding over a
        # temperature (trained with sampled softmax); the other tasks come from a linear head.
        num_head_tasks = len(cfg.task_names) - 1
        self.head = nn.Dense(d, num_head_tasks, weight_init=Normal(0.02)) if num_head_tasks else None
        self.inv_temperature = 1.0 / cfg.score_temperature
        self.inv_norm = 1.0 / cfg.max_seq_len  # constant N_norm (see ModelConfig.max_seq_len)
        # (q scale, 1 / N_norm) for the fused kernel, which applies both inside its GEMMs
        self.attention_scales = Tensor(np.array([self.layers[0].q_scale, self.inv_norm], np.float32))
        self.block_len = cfg.attention_block_len
        self.candidate_action = cfg.num_actions + 1

    def assemble_weights(self) -> None:
        """Refresh every layer's assembled W1/b1 from its per-head parameters (after any weight change)."""
        for layer in self.layers:
            layer.assemble_weights()

    def embed(self, item_ids: Tensor, action_ids: Tensor, pos: Tensor) -> Tensor:
        """Item + action + position embeddings (padding positions past the table are clipped)."""
        return (ops.gather(self.item_table, item_ids, 0) + ops.gather(self.action_table, action_ids, 0)
                + self.embed_positions(pos))

    def embed_positions(self, pos: Tensor) -> Tensor:
        return ops.gather(self.pos_table, ops.clip_by_value(pos, 0, self.max_pos), 0)

    def add_user_token(self, x: Tensor, user_feats: Tensor, user_row: Tensor) -> Tensor:
        """Add the summed user-feature embeddings to the rows where user_row == 1."""
        user = ops.sum(ops.gather(self.user_table, user_feats, 0), 0, keepdim=True)
        return x + ops.expand_dims(user_row, 1) * user

    def embed_candidates(self, cand_ids: Tensor, cand_pos: Tensor) -> Tensor:
        """Candidates share one position (cand_pos [1]) and the "candidate" action."""
        action = take(self.action_table, self.candidate_action, self.candidate_action + 1)
        return ops.gather(self.item_table, cand_ids, 0) + action + self.embed_positions(cand_pos)

    def logits(self, user_hidden: Tensor, cand_hidden: Tensor, cand_ids: Tensor) -> Tensor:
        """Candidate logits [M, tasks]: engage = cos(user state, candidate item embedding) / temperature, the
        user state being the last behaviour token's final state [1, d] (what every position learns to predict
        the next item with); the other tasks from the head on each candidate's final state [M, d]."""
        engage = self.engage_logits(self.final_norm(user_hidden), ops.gather(self.item_table, cand_ids, 0))
        if self.head is None:
            return ops.expand_dims(engage, -1)
        return ops.concat((ops.expand_dims(engage, -1), self.head(self.final_norm(cand_hidden))), axis=-1)

    def engage_logits(self, hidden: Tensor, item_emb: Tensor) -> Tensor:
        """cos(hidden, item_emb) / temperature over the last axis (final-normed hidden states)."""
        return ops.reduce_sum(unit(hidden) * unit(item_emb), -1) * self.inv_temperature

    def engage_matrix(self, user: Tensor, item_emb: Tensor) -> Tensor:
        """Engage logits [B, I] of final-normed user states [B, d] against items [I, d]."""
        return ops.matmul(unit(user), ops.transpose(unit(item_emb), (1, 0))) * self.inv_temperature

    def encode(self, x, meta, past, cand, cand_meta, backend, last=None):
        """Run all layers.

        x [n, d] new tokens; meta = (pos [n] int32, time hi [n], time lo [n], valid [n] bool).
        past = None or (K/V per layer, pos [P], hi [P], lo [P], valid [P]); K/V of a layer is
        (K, K at, V, V at) as the backend's attention takes them (pool views, or head-major with at = None).
        cand = None or [M, d]; cand_meta = (pos [1], hi [1], lo [1]): all candidates share them.
        backend: the model's backend (model/backend.py), whose ops every layer runs.
        last = None or int32 [1]: the row of the last valid new token, whose final state (the user state) is
        returned; the last layer computes that one row of the new tokens.
        Pointwise attention has no softmax normaliser, so attention over [past | new] keys is the sum
        of the two parts: cached K/V are used as read, never concatenated.
        Returns (new K per layer, new V per layer, candidate hidden or None, user state [1, d] or None). K and V
        are head-major ([h, n, dqk], [h, n, dv]) with plain ops; when the backend reads views both are each
        layer's projection output y [n (+ M), W], which its `write_prefix` reads in place (see
        HSTULayer.rows_at).
        """
        if backend.reads_views:
            return self._encode_rows(x, meta, past, cand, cand_meta, backend, last)
        return self._encode_heads(x, meta, past, cand, cand_meta, backend, last)

    def _user_row(self, layer, x, meta, past, new_kv, past_kv, backend, last):
        """The last layer's output for the user-state row `last` [1] of the new tokens: its own projection
        (all columns) and attention over the new keys and the past (one kernel call for both with views)."""
        x_u = ops.gather(x, last, 0)  # [1, d]
        y_u = backend.project(layer, x_u)
        q_meta = tuple(ops.gather(m, last, 0) for m in meta[:3])
        idx = backend.prepare(self.rab, q_meta, meta)
        past_idx = None if past is None else backend.prepare(self.rab, q_meta, past[1:])
        u = layer.part(y_u, "u")
        query = (y_u, layer.view_at("q")) if backend.reads_views else (layer.heads(y_u, "q") * layer.q_scale, None)
        more = () if past is None else ((past_kv, past_idx),)
        av = backend.attention(self.rab, query, new_kv, idx, u, self.attention_scales, self.inv_norm, more)
        return backend.finish(layer, x_u, av, u)

    def _encode_rows(self, x, meta, past, cand, cand_meta, backend, last):
        """`encode` when attention reads Q/K/V in place (FusedCpuOps): the candidates are rows n.. of one
        token matrix, so every layer runs one projection, one kernel call per query block over the new keys
        (the last block also holds the candidates, whose keys are the history and themselves) and one kernel
        call for all rows over the past keys."""
        n = x.shape[0]
        blocks = query_blocks(n, self.block_len)
        rows = n if cand is None else n + cand.shape[0]
        if cand is not None:
            x = ops.concat((x, cand))
        new_idx = [backend.prepare_window(self.rab, meta, (s, e), meta, (0, e)) for s, e in blocks]
        cand_idx = None
        if cand is not None:
            cand_idx = self._candidate_rows(backend.prepare(self.rab, cand_meta, meta), rows - n)
        if cand_idx is not None:
            # The last block's rows see no candidate keys; then the candidate rows.
            s, e = blocks[-1]
            masked = ops.full((e - s, rows - n), self.rab.mask_index, dtype=mstype.int32)
            new_idx[-1] = ops.concat((ops.concat((new_idx[-1], masked), axis=1), cand_idx))
        past_idx = cand_past_idx = None
        if past is not None:
            past_idx = backend.prepare_window(self.rab, meta, (0, n), past[1:], (0, past[1].shape[0]))
            if cand is not None:
                cand_past_idx = backend.prepare(self.rab, cand_meta, past[1:])
                past_idx = ops.concat((past_idx, cand_past_idx))  # the candidates share its last row

        projections = ()  # what the pool stores (unused, so pruned, when ranking)
        user = None
        final = len(self.layers) - 1
        for layer_id, layer in enumerate(self.layers):
            # The last layer's token rows feed only their K and V (to the pool, and to the candidates).
            y = backend.project(layer, x, kv_only_rows=n if layer_id == final else 0)
            projections += (y,)
            new_kv = (y, layer.view_at("k"), y, layer.view_at("v"))
            past_kv = None if past is None else past[0][layer_id]
            if layer_id == final and last is not None:
                user = self._user_row(layer, x, meta, past, new_kv, past_kv, backend, last)
            if layer_id == final and cand is None:
                break  # only the last layer's K/V (and the user row) are needed
            u = layer.part(y, "u")
            if layer_id < final:
                if past is not None and len(blocks) == 1:  # one call over [past | new] keys (ranking, short chunks)
                    av = self._attend_rows(backend, layer, y, 0, past_kv, past_idx, u, more=((new_kv, new_idx[0]),))
                else:
                    av = ()
                    for b, (s, e) in enumerate(blocks):
                        e = rows if b == len(blocks) - 1 else e
                        like = shape_carrier(e - s, u.shape[1])  # the block's output shape, without slicing u
                        av += (self._attend_rows(backend, layer, y, s, new_kv, new_idx[b], like),)
                    av = ops.concat(av) if len(av) > 1 else av[0]
                    if past is not None:
                        av = av + self._attend_rows(backend, layer, y, 0, past_kv, past_idx, u)
                x = backend.finish(layer, x, av, u)
            else:  # the last layer's token outputs feed nothing: only the candidate rows
                u_c = take(u, n, rows)
                if past is None:
                    av = self._attend_rows(backend, layer, y, n, new_kv, cand_idx, u_c)
                else:
                    av = self._attend_rows(backend, layer, y, n, past_kv, cand_past_idx, u_c,
                                           more=((new_kv, cand_idx),))
                x = backend.finish(layer, take(x, n, rows), av, u_c)
        return projections, projections, None if cand is None else x, user

    def _candidate_rows(self, row, num_cands):
        """Bucket indices of the candidates over [history | candidates] keys: the shared history row [1, n],
        then each candidate over itself (index 0 = distance 0, time 0) and no other candidate."""
        own = Tensor(np.where(np.eye(num_cands, dtype=bool), 0, self.rab.mask_index).astype(np.int32))  # a constant
        return ops.concat((ops.broadcast_to(row, (num_cands, row.shape[1])), own), axis=1)

    def _attend_rows(self, backend, layer, y, first_row, kv, idx, like, more=()):
        """Attention of query rows [first_row, first_row + like rows) of y, read in place, over the keys of kv
        (and of each further (kv, idx) segment in `more`, summed in the same call)."""
        return backend.attention(self.rab, (y, layer.view_at("q", first_row)), kv, idx, like,
                                 self.attention_scales, self.inv_norm, more)

    def _encode_heads(self, x, meta, past, cand, cand_meta, backend, last):
        """`encode` on head-major Q/K/V (PlainOps): the candidates as a separate token matrix with their own
        self-attention term."""
        blocks = query_blocks(x.shape[0], self.block_len)
        past_meta = None if past is None else past[1:]
        # Bias is built once per request and reused by every layer; candidates share one row.
        block_bias = self.block_biases(backend, meta, past_meta, blocks)
        cand_bias = None
        if cand is not None:
            cand_bias = (backend.prepare(self.rab, cand_meta, meta),
                         None if past is None else backend.prepare(self.rab, cand_meta, past_meta))
        self_bias = ops.transpose(self.rab.self_bias(), (1, 0))  # [1, h]

        new_keys, new_values = (), ()
        user = None
        final = len(self.layers) - 1
        for layer_id, layer in enumerate(self.layers):
            y = backend.project(layer, x)
            k, v = layer.heads(y, "k"), layer.heads(y, "v")  # what the pool stores (unused ones are pruned)
            new_keys += (k,)
            new_values += (v,)
            new_kv = (k, None, v, None)
            past_kv = None if past is None else past[0][layer_id]
            if cand is not None:
                yc = backend.project(layer, cand)
                uc = layer.part(yc, "u")
                av_c = self._attend(backend, (layer.heads(yc, "q") * layer.q_scale, None), new_kv, past_kv,
                                    cand_bias)
                av_c = av_c + layer.self_attention(yc, self_bias, self.inv_norm)
                cand = backend.finish(layer, cand, av_c, uc)
            if layer_id == final and last is not None:
                user = self._user_row(layer, x, meta, past, new_kv, past_kv, backend, last)
            if layer_id < final:  # the last layer's token outputs feed nothing but the user row and K/V
                q_all = layer.heads(y, "q") * layer.q_scale
                av = tuple(self._attend(backend, (take(q_all, s, e, 1), None), new_kv, past_kv, block_bias[b])
                           for b, (s, e) in enumerate(blocks))
                u = layer.part(y, "u")
                x = backend.finish(layer, x, ops.concat(av) if len(av) > 1 else av[0], u)
        return new_keys, new_values, cand, user

    def block_biases(self, backend, meta, past_meta, blocks):
        """Head-major bias of each query block (s, e) of the new tokens `meta` over the new keys [0, e) and over
        the past keys `past_meta` (None: no past): ((new bias, past bias or None), ...) for `_attend`."""
        out = ()
        for s, e in blocks:
            q_meta = tuple(take(m, s, e) for m in meta[:3])
            new_bias = backend.prepare(self.rab, q_meta, tuple(take(m, 0, e) for m in meta))
            past_bias = None if past_meta is None else backend.prepare(self.rab, q_meta, past_meta)
            out += ((new_bias, past_bias),)
        return out

    def _attend(self, backend, query, new_kv, past_kv, bias):
        """Attention of a head-major query block over new keys (causal; the bias says how many) plus, if any,
        the past; bias = (new keys' bias, past keys' bias)."""
        more = () if past_kv is None else ((past_kv, bias[1]),)
        return backend.attention(self.rab, query, new_kv, bias[0], None, self.attention_scales, self.inv_norm,
                                 more)


def unit(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / ||x|| over the last axis (rsqrt form: ops.L2Normalize's CPU backward is ~40x slower)."""
    return x * ops.rsqrt(ops.sum(x * x, -1, keepdim=True) + eps)


class FullGraph(nn.Cell):
    """All tokens -> candidate logits (training, reference and the baseline serving path)."""

    def __init__(self, net: HSTUNet, backend: Backend) -> None:
        super().__init__()
        self.net, self.backend = net, backend

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  cand_ids, cand_pos, cand_hi, cand_lo, last):
        x = self.net.add_user_token(self.net.embed(item_ids, action_ids, pos), user_feats, user_row)
        cand = self.net.embed_candidates(cand_ids, cand_pos)
        _, _, hidden, user = self.net.encode(x, (pos, hi, lo, valid), None, cand, (cand_pos, cand_hi, cand_lo),
                                             self.backend, last)
        return self.net.logits(user, hidden, cand_ids)


class PrefixGraph(nn.Cell):
    """Prefix tokens (optionally extending a slot's cached tokens) -> K/V written in place.

    The slot inputs are the backend's: PoolLayout.read_views (a backend that reads views) or read_ids."""

    def __init__(self, net: HSTUNet, pool: KVPool, backend: Backend, with_past: bool) -> None:
        super().__init__()
        self.net, self.pool, self.backend, self.with_past = net, pool, backend, with_past

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  write_kv_ids, write_time_ids, past_kv_ids, past_time_ids, past_pos, past_valid):
        x = self.net.add_user_token(self.net.embed(item_ids, action_ids, pos), user_feats, user_row)
        past = None
        if self.with_past:
            past = self.backend.read_past(self.pool, past_kv_ids, past_time_ids, past_pos, past_valid)
        keys, values, _, _ = self.net.encode(x, (pos, hi, lo, valid), past, None, None, self.backend)
        done = self.backend.write_prefix(self.pool, self.net.layers[0], write_kv_ids, write_time_ids, keys, values,
                                         hi, lo)
        return ops.depend(ops.reduce_sum(ops.cast(valid, mstype.int32)), done)


class CandidateGraph(nn.Cell):
    """A cached slot + short-term suffix tokens + candidates -> candidate logits."""

    def __init__(self, net: HSTUNet, pool: KVPool, backend: Backend) -> None:
        super().__init__()
        self.net, self.pool, self.backend = net, pool, backend

    def construct(self, item_ids, action_ids, pos, hi, lo, valid, past_kv_ids, past_time_ids, past_pos,
                  past_valid, cand_ids, cand_pos, cand_hi, cand_lo, last):
        x = self.net.embed(item_ids, action_ids, pos)
        cand = self.net.embed_candidates(cand_ids, cand_pos)
        past = self.backend.read_past(self.pool, past_kv_ids, past_time_ids, past_pos, past_valid)
        _, _, hidden, user = self.net.encode(x, (pos, hi, lo, valid), past, cand, (cand_pos, cand_hi, cand_lo),
                                             self.backend, last)
        return self.net.logits(user, hidden, cand_ids)


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
