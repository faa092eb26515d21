"""Graphs of B users in one call, one per kind of backend: cached-prefix ranking (`candidate_batch_graph`) and
prefill chunks (`prefix_batch_graph`, below the ranking graphs: the same layout, each user's K/V written into its
own slot).

Each user reads its own pool slot in place (the attention kernel's views, as `CandidateGraph`), has its own
suffix, prefix length and candidates, all padded to one bucket (past P, suffix S, candidates M). The rows of
the B users sit in one token matrix, user b at rows [b R, (b + 1) R) with R = S + M (its suffix, then its
candidates), so every dense step runs once for all users: each layer's UVQK projection is one GEMM over B R
rows and its output projection one fused call; only attention runs per user (its own past, its own keys).
The bias indices of every user come from the flat [B S] metadata through windows: no slicing ops.
Scores equal the single-user graph's (tests/model/test_batched.py).

`PlainBatchedCandidateGraph` is the same on head-major tensors (PlainOps, the path Ascend runs): each layer's
projections of all users' suffix tokens and of all their candidates are one matmul each, as is the output
projection; attention runs per user on head-major Q/K/V, over its slot's K/V gathered from the pool.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore import dtype as mstype

from mindspore_relaygr.model.backend import Backend
from mindspore_relaygr.model.hstu import query_blocks, shape_carrier, take
from mindspore_relaygr.model.network import HSTUNet, unit
from mindspore_relaygr.model.pool import KVPool


def _flat(t: Tensor) -> Tensor:
    return ops.reshape(t, (-1,))


def candidate_batch_graph(net: HSTUNet, pool: KVPool, backend: Backend) -> nn.Cell:
    """The batched ranking graph of `backend`: in-place views when it reads them, else head-major tensors."""
    graph = BatchedCandidateGraph if backend.reads_views else PlainBatchedCandidateGraph
    return graph(net, pool, backend)


class BatchedCandidateGraph(nn.Cell):
    """B cached slots + suffixes + candidates -> candidate logits [B, M, tasks], on a backend that reads views."""

    def __init__(self, net: HSTUNet, pool: KVPool, backend: Backend) -> None:
        super().__init__()
        if not backend.reads_views:
            raise ValueError(f"this batched ranking graph needs a backend that reads views, not {backend.name!r}")
        self.net, self.pool, self.backend = net, pool, backend
        self.num_layers = len(net.layers)

    def construct(self, item_ids, action_ids, pos, hi, lo, valid, past_kv_ids, past_time_ids, past_pos, past_valid,
                  cand_ids, cand_pos, cand_hi, cand_lo, last):
        """item_ids, action_ids, pos [B, S] int32, hi, lo [B, S] fp32, valid [B, S] bool; past_kv_ids [B, L * 8]
        int64 (PoolLayout.read_views of each slot), past_time_ids, past_pos [B, P] int32, past_valid [B, P] bool;
        cand_ids [B, M] int32; cand_pos [B] int32, cand_hi, cand_lo [B] fp32; last [B] int32 (the row of each
        user's last valid suffix token)."""
        net, rab, backend = self.net, self.net.rab, self.backend
        b, s = item_ids.shape
        m, p = cand_ids.shape[1], past_pos.shape[1]
        r = s + m
        meta = (_flat(pos), _flat(hi), _flat(lo), _flat(valid))  # [B S] each
        past_hi, past_lo = self.pool.read_times(_flat(past_time_ids))
        past_meta = (_flat(past_pos), past_hi, past_lo, _flat(past_valid))  # [B P] each
        cand_meta = (cand_pos, cand_hi, cand_lo)  # [B] each

        tokens = ops.reshape(net.embed(_flat(item_ids), _flat(action_ids), meta[0]), (b, s, -1))
        cands = ops.gather(net.item_table, _flat(cand_ids), 0) + take(net.action_table, net.candidate_action,
                                                                     net.candidate_action + 1)
        cands = ops.reshape(cands, (b, m, -1)) + ops.expand_dims(net.embed_positions(cand_pos), 1)
        x = ops.reshape(ops.concat((tokens, cands), axis=1), (b * r, -1))  # user i: rows [i R, (i + 1) R)

        # Bias indices per user, built once and read by every layer (as CandidateGraph builds them).
        own = Tensor(np.where(np.eye(m, dtype=bool), 0, rab.mask_index).astype(np.int32))
        masked = ops.full((s, m), rab.mask_index, dtype=mstype.int32)
        new_idx, past_idx, cand_new_idx, cand_past_idx = (), (), (), ()
        for i in range(b):
            rows, keys = (i * s, i * s + s), (i * p, i * p + p)
            cand_row = backend.prepare_window(rab, cand_meta, (i, i + 1), meta, rows)  # [1, S]
            cand_rows = ops.concat((ops.broadcast_to(cand_row, (m, s)), own), axis=1)  # [M, R]
            new_rows = ops.concat((backend.prepare_window(rab, meta, rows, meta, rows), masked), axis=1)
            new_idx += (ops.concat((new_rows, cand_rows)),)  # [R, R]
            cand_past = backend.prepare_window(rab, cand_meta, (i, i + 1), past_meta, keys)  # [1, P]
            past_rows = backend.prepare_window(rab, meta, rows, past_meta, keys)
            past_idx += (ops.concat((past_rows, cand_past)),)  # [S + 1, P]
            cand_new_idx += (cand_rows,)
            cand_past_idx += (cand_past,)
        last_rows = last + Tensor(np.arange(b, dtype=np.int32) * r)  # the user rows in x
        last_meta = tuple(ops.gather(t, last + Tensor(np.arange(b, dtype=np.int32) * s), 0) for t in meta[:3])

        final = self.num_layers - 1
        user = None
        views = _flat(past_kv_ids)
        for layer_id, layer in enumerate(net.layers):
            y = backend.project(layer, x)  # [B R, W]: one GEMM for every user's rows
            past_kv = [_slot_views(self.pool, views, i, layer_id, self.num_layers) for i in range(b)]
            new_kv = [(y, layer.view_at("k", i * r), y, layer.view_at("v", i * r)) for i in range(b)]
            u = layer.part(y, "u")
            if layer_id < final:
                av = ()
                for i in range(b):
                    av += (backend.attention(rab, (y, layer.view_at("q", i * r)), past_kv[i], past_idx[i],
                                             shape_carrier(r, u.shape[1]), net.attention_scales, net.inv_norm,
                                             ((new_kv[i], new_idx[i]),)),)
                x = backend.finish(layer, x, ops.concat(av), u)
                continue
            user = self._user_rows(layer, x, last_rows, last_meta, meta, past_meta, new_kv, past_kv, s, p)
            # The last layer: only the candidate rows (and the user rows above) feed the output.
            av, x_c, u_c = (), (), ()
            for i in range(b):
                first = i * r + s
                u_c += (take(u, first, first + m),)
                x_c += (take(x, first, first + m),)
                av += (backend.attention(rab, (y, layer.view_at("q", first)), past_kv[i], cand_past_idx[i],
                                         shape_carrier(m, u.shape[1]), net.attention_scales, net.inv_norm,
                                         ((new_kv[i], cand_new_idx[i]),)),)
            x = backend.finish(layer, ops.concat(x_c), ops.concat(av), ops.concat(u_c))  # [B M, d]
        return _batched_logits(self.net, user, x, cand_ids)

    def _user_rows(self, layer, x, last_rows, last_meta, meta, past_meta, new_kv, past_kv, s: int, p: int):
        """Every user's state row of the last layer [B, d]: one projection for the B rows, attention per user
        over its new keys and its past (as HSTUNet._user_row does for one user)."""
        net, rab, backend = self.net, self.net.rab, self.backend
        x_u = ops.gather(x, last_rows, 0)  # [B, d]
        y_u = backend.project(layer, x_u)
        u = layer.part(y_u, "u")
        av = ()
        for i in range(len(new_kv)):
            q_rows = (i, i + 1)
            idx = backend.prepare_window(rab, last_meta, q_rows, meta, (i * s, i * s + s))
            past_idx = backend.prepare_window(rab, last_meta, q_rows, past_meta, (i * p, i * p + p))
            av += (backend.attention(rab, (y_u, layer.view_at("q", i)), new_kv[i], idx,
                                     shape_carrier(1, u.shape[1]), net.attention_scales, net.inv_norm,
                                     ((past_kv[i], past_idx),)),)
        return backend.finish(layer, x_u, ops.concat(av), u)


def _slot_views(pool: KVPool, views: Tensor, i: int, layer_id: int, num_layers: int) -> tuple:
    """(K, K at, V, V at) of user i's slot in one layer, read in place: `views` holds every user's
    PoolLayout.read_views, flat ([B L 8])."""
    at = (i * num_layers + layer_id) * 8
    return (pool.keys, ops.slice(views, (at,), (4,)), pool.values, ops.slice(views, (at + 4,), (4,)))


def _batched_logits(net: HSTUNet, user, cand_hidden, cand_ids):
    """[B, M, tasks]: engage = cos(user state, candidate item embedding) / temperature, the other tasks from the
    head on each candidate's state (HSTUNet.logits for B users; user [B, d], cand_hidden [B M, d])."""
    b, m = cand_ids.shape
    items = ops.reshape(ops.gather(net.item_table, ops.reshape(cand_ids, (-1,)), 0), (b, m, -1))
    users = ops.expand_dims(unit(net.final_norm(user)), 1)  # [B, 1, d]
    engage = ops.expand_dims(ops.reduce_sum(users * unit(items), -1) * net.inv_temperature, -1)
    if net.head is None:
        return engage
    head = ops.reshape(net.head(net.final_norm(cand_hidden)), (b, m, -1))
    return ops.concat((engage, head), axis=-1)


class PlainBatchedCandidateGraph(nn.Cell):
    """B cached slots + suffixes + candidates -> candidate logits [B, M, tasks] on head-major tensors; the inputs
    of BatchedCandidateGraph, with each slot's K/V row ids (PoolLayout.read_ids) for `past_kv_ids` [B, L H P]."""

    def __init__(self, net: HSTUNet, pool: KVPool, backend: Backend) -> None:
        super().__init__()
        if backend.reads_views:
            raise ValueError(f"this batched ranking graph needs a backend that does not read views, not "
                             f"{backend.name!r}")
        self.net, self.pool, self.backend = net, pool, backend

    def construct(self, item_ids, action_ids, pos, hi, lo, valid, past_kv_ids, past_time_ids, past_pos, past_valid,
                  cand_ids, cand_pos, cand_hi, cand_lo, last):
        pasts = []
        for i in range(item_ids.shape[0]):
            pasts.append(self.pool.read(past_kv_ids[i], past_time_ids[i]))  # (K per layer, V per layer, hi, lo)
        return heads_batched_logits(self.net, self.backend, (item_ids, action_ids, pos, hi, lo, valid), pasts,
                                    (past_pos, past_valid), (cand_ids, cand_pos, cand_hi, cand_lo), last)


def heads_batched_logits(net: HSTUNet, backend: Backend, tokens: tuple, pasts: list, past_rows: tuple,
                         candidates: tuple, last):
    """Candidate logits [B, M, tasks] of B users on head-major tensors (PlainOps): tokens = (item_ids, action_ids,
    pos, hi, lo, valid) [B, S]; pasts = per user (K per layer [h, P, dqk], V per layer [h, P, dv], hi [P], lo [P]);
    past_rows = (past_pos, past_valid) [B, P]; candidates = (cand_ids [B, M], cand_pos, cand_hi, cand_lo [B]);
    last [B]. Each layer's projections of all users' tokens and of all their candidates are one matmul each;
    attention runs per user over its own past and keys. Shared by the pool graph above and the exported
    batched MindIR graph, which takes K/V as inputs."""
    item_ids, action_ids, pos, hi, lo, valid = tokens
    past_pos, past_valid = past_rows
    cand_ids, cand_pos, cand_hi, cand_lo = candidates
    rab = net.rab
    b, s = item_ids.shape
    m = cand_ids.shape[1]
    x = net.embed(_flat(item_ids), _flat(action_ids), _flat(pos))  # [B S, d]
    cand = ops.gather(net.item_table, _flat(cand_ids), 0) + take(net.action_table, net.candidate_action,
                                                                 net.candidate_action + 1)
    cand = ops.reshape(ops.reshape(cand, (b, m, -1)) + ops.expand_dims(net.embed_positions(cand_pos), 1),
                       (b * m, -1))
    metas, user_kv, cand_metas, biases = [], [], [], []
    for i in range(b):
        meta = (pos[i], hi[i], lo[i], valid[i])
        keys, values, p_hi, p_lo = pasts[i]
        past_meta = (past_pos[i], p_hi, p_lo, past_valid[i])
        cand_meta = (cand_pos[i:i + 1], cand_hi[i:i + 1], cand_lo[i:i + 1])
        metas.append(meta)
        user_kv.append((keys, values))
        cand_metas.append(cand_meta)
        # Bias values, built once per user and read by every layer (as HSTUNet._encode_heads).
        biases.append(((backend.prepare(rab, meta[:3], meta), backend.prepare(rab, meta[:3], past_meta)),
                       (backend.prepare(rab, cand_meta, meta), backend.prepare(rab, cand_meta, past_meta)),
                       past_meta))
    self_bias = ops.transpose(rab.self_bias(), (1, 0))  # [1, h]
    final = len(net.layers) - 1
    user = None
    for layer_id, layer in enumerate(net.layers):
        # one matmul for every user's tokens, one for candidates
        y, yc = backend.project(layer, x), backend.project(layer, cand)
        k, v = layer.heads(y, "k"), layer.heads(y, "v")  # [h, B S, d]
        q, qc = layer.heads(y, "q") * layer.q_scale, layer.heads(yc, "q") * layer.q_scale
        av, av_c, users = (), (), ()
        for i in range(b):
            new_kv = (take(k, i * s, i * s + s, 1), None, take(v, i * s, i * s + s, 1), None)
            keys, values = user_kv[i]
            past_kv = (keys[layer_id], None, values[layer_id], None)
            token_bias, cand_bias, past_meta = biases[i]
            av_c += (net._attend(backend, (take(qc, i * m, i * m + m, 1), None), new_kv, past_kv, cand_bias),)
            if layer_id < final:
                av += (net._attend(backend, (take(q, i * s, i * s + s, 1), None), new_kv, past_kv, token_bias),)
            else:
                past = (None, *past_meta)
                users += (net._user_row(layer, take(x, i * s, i * s + s), metas[i], past, new_kv, past_kv,
                                        backend, last[i:i + 1]),)
        av_c = ops.concat(av_c) + layer.self_attention(yc, self_bias, net.inv_norm)
        cand = backend.finish(layer, cand, av_c, layer.part(yc, "u"))
        if layer_id < final:
            x = backend.finish(layer, x, ops.concat(av), layer.part(y, "u"))
        else:
            user = ops.concat(users)
    return _batched_logits(net, user, cand, cand_ids)


def prefix_batch_graph(net: HSTUNet, pool: KVPool, backend: Backend, with_past: bool) -> nn.Cell:
    """The batched prefill graph of `backend` (the inputs of PrefixGraph with a leading B axis): B users' chunks,
    each written into its own slot; `with_past`: the chunks read their slots' cached tokens (extensions)."""
    graph = BatchedPrefixGraph if backend.reads_views else PlainBatchedPrefixGraph
    return graph(net, pool, backend, with_past)


class _PrefixBatchCell(nn.Cell):
    def __init__(self, net: HSTUNet, pool: KVPool, backend: Backend, with_past: bool) -> None:
        super().__init__()
        self.net, self.pool, self.backend, self.with_past = net, pool, backend, with_past
        self.num_layers = len(net.layers)


class BatchedPrefixGraph(_PrefixBatchCell):
    """B users' prefill chunks -> K/V written into their slots in place, on a backend that reads views.

    The chunks of the B users sit in one token matrix (user b at rows [b C, (b + 1) C)): each layer's projection
    is one GEMM over all rows and its output projection one call; attention runs per user and query block over
    the user's own new keys and, with a past, its own slot read in place (a first chunk's past is all invalid:
    its masked keys add exactly 0). The last layer's K/V of all users go to the pool in one copy per tensor."""

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  write_kv_ids, write_time_ids, past_kv_ids, past_time_ids, past_pos, past_valid):
        """Each input of PrefixGraph with a leading B axis; past_kv_ids [B, L * 8] int64 (PoolLayout.read_views),
        or [B, 1] placeholders without a past. Returns each user's valid token count [B]."""
        net, rab, backend = self.net, self.net.rab, self.backend
        b, c = item_ids.shape
        p = past_pos.shape[1]
        blocks = query_blocks(c, net.block_len)
        x = _embed_chunks(net, item_ids, action_ids, user_feats, user_row, pos)
        meta = (_flat(pos), _flat(hi), _flat(lo), _flat(valid))  # [B C] each
        past_meta = None
        if self.with_past:
            past_hi, past_lo = self.pool.read_times(_flat(past_time_ids))
            past_meta = (_flat(past_pos), past_hi, past_lo, _flat(past_valid))  # [B P] each
        # Bias indices of every (user, query block), built once and read by every layer: windows of the flat
        # metadata, no slices.
        new_idx, past_idx = (), ()
        for i in range(b):
            for s, e in blocks:
                rows = (i * c + s, i * c + e)
                new_idx += (backend.prepare_window(rab, meta, rows, meta, (i * c, i * c + e)),)
                if self.with_past:
                    past_idx += (backend.prepare_window(rab, meta, rows, past_meta, (i * p, i * p + p)),)

        views = _flat(past_kv_ids)
        final = self.num_layers - 1
        ys = ()
        for layer_id, layer in enumerate(net.layers):
            # [B C, W]: one GEMM for every user's rows; the last layer's rows feed only their K and V (the pool)
            y = backend.project(layer, x, kv_only_rows=b * c if layer_id == final else 0)
            ys += (y,)
            if layer_id == final:
                break
            u = layer.part(y, "u")
            av = ()
            for i in range(b):
                new_kv = (y, layer.view_at("k", i * c), y, layer.view_at("v", i * c))
                past_kv = _slot_views(self.pool, views, i, layer_id, self.num_layers) if self.with_past else None
                for j, (s, e) in enumerate(blocks):
                    k = i * len(blocks) + j
                    query = (y, layer.view_at("q", i * c + s))
                    like = shape_carrier(e - s, u.shape[1])
                    if self.with_past:  # past then new keys, summed in one call (as HSTUNet._encode_rows)
                        av += (backend.attention(rab, query, past_kv, past_idx[k], like, net.attention_scales,
                                                 net.inv_norm, ((new_kv, new_idx[k]),)),)
                    else:
                        av += (backend.attention(rab, query, new_kv, new_idx[k], like, net.attention_scales,
                                                 net.inv_norm),)
            x = backend.finish(layer, x, ops.concat(av), u)
        return _write_chunks(net, self.pool, backend, (write_kv_ids, write_time_ids), ys, ys, (hi, lo, valid))


class PlainBatchedPrefixGraph(_PrefixBatchCell):
    """B users' prefill chunks -> K/V written into their slots on head-major tensors (PlainOps): the inputs of
    BatchedPrefixGraph, with each slot's K/V row ids (PoolLayout.read_ids) for `past_kv_ids` [B, L H P]. Each
    layer's projection is one matmul over all users' rows; attention runs per user and query block over its new
    keys and its slot's K/V gathered from the pool; all users' K/V are written with one scatter_update each."""

    def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid,
                  write_kv_ids, write_time_ids, past_kv_ids, past_time_ids, past_pos, past_valid):
        net, backend = self.net, self.backend
        b, c = item_ids.shape
        blocks = query_blocks(c, net.block_len)
        x = _embed_chunks(net, item_ids, action_ids, user_feats, user_row, pos)
        pasts, biases = (), ()
        for i in range(b):
            past_meta = None
            if self.with_past:
                keys, values, p_hi, p_lo = self.pool.read(past_kv_ids[i], past_time_ids[i])
                pasts += ((keys, values),)
                past_meta = (past_pos[i], p_hi, p_lo, past_valid[i])
            biases += (net.block_biases(backend, (pos[i], hi[i], lo[i], valid[i]), past_meta, blocks),)

        final = self.num_layers - 1
        new_keys, new_values = (), ()
        for layer_id, layer in enumerate(net.layers):
            y = backend.project(layer, x)  # one matmul for every user's rows
            k, v = layer.heads(y, "k"), layer.heads(y, "v")  # [h, B C, d]
            new_keys += (k,)
            new_values += (v,)
            if layer_id == final:
                break
            q = layer.heads(y, "q") * layer.q_scale
            av = ()
            for i in range(b):
                past_kv = None
                if self.with_past:
                    past_kv = (pasts[i][0][layer_id], None, pasts[i][1][layer_id], None)
                for j, (s, e) in enumerate(blocks):
                    first = i * c
                    new_kv = (take(k, first, first + e, 1), None, take(v, first, first + e, 1), None)
                    query = (take(q, first + s, first + e, 1), None)
                    av += (net._attend(backend, query, new_kv, past_kv, biases[i][j]),)
            x = backend.finish(layer, x, ops.concat(av), layer.part(y, "u"))
        return _write_chunks(net, self.pool, backend, (write_kv_ids, write_time_ids), new_keys, new_values,
                             (hi, lo, valid))


def _embed_chunks(net: HSTUNet, item_ids, action_ids, user_feats, user_row, pos):
    """Every user's chunk rows [B C, d] (user b at rows [b C, (b + 1) C)), each user's summed feature embedding
    added on its rows where user_row == 1 (HSTUNet.add_user_token for B users; user_feats [B, F])."""
    b, c = item_ids.shape
    x = ops.reshape(net.embed(_flat(item_ids), _flat(action_ids), _flat(pos)), (b, c, -1))
    user = ops.sum(ops.gather(net.user_table, user_feats, 0), 1, keepdim=True)  # [B, 1, d]
    return ops.reshape(x + ops.expand_dims(user_row, 2) * user, (b * c, -1))


def _write_chunks(net: HSTUNet, pool: KVPool, backend: Backend, write_ids: tuple, keys: tuple, values: tuple,
                  token_rows: tuple):
    """Write all users' K/V (per layer, in the rows of the token matrix) and times into the pool in place, one
    write per tensor: write_ids = (kv ids [B, L H C], time ids [B, C]); the kv ids are reordered to (layer, head,
    user, token), the order of those rows. token_rows = (hi, lo, valid) [B, C]. Returns the valid counts [B].
    Padding tokens of different users may share scratch rows: nothing reads those."""
    kv_ids, time_ids = write_ids
    hi, lo, valid = token_rows
    b, c = time_ids.shape
    kv_ids = _flat(ops.transpose(ops.reshape(kv_ids, (b, -1, c)), (1, 0, 2)))
    done = backend.write_prefix(pool, net.layers[0], kv_ids, _flat(time_ids), keys, values, _flat(hi), _flat(lo))
    return ops.depend(ops.reduce_sum(ops.cast(valid, mstype.int32), 1), done)
