"""An independent float64 numpy oracle of the HSTU ranker, written from docs/design.md ("The model").

It shares no code with `mindspore_relaygr.model`: the token layout, the relative (position, time) buckets,
the masks and the layers are re-derived here from the design's formulas, and the only input taken from the
package is the weights (`weights_of(model.net)`). Everything is computed on the whole token sequence at once
(history tokens, then the candidates), in float64, with exact integer time differences: no bucketing to
static shapes, no pool, no blocks, no fused kernels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindspore_relaygr.config import ModelConfig

LAYER_NORM_EPS = 1e-7  # MindSpore's nn.LayerNorm default, which every norm of the network uses


def weights_of(net: Any) -> dict[str, np.ndarray]:
    """The network's own parameters by name, without the derived `*_assembled` copies of W1 / b1."""
    return {p.name: p.asnumpy() for p in net.get_parameters() if not p.name.endswith("_assembled")}


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """LayerNorm over the last axis (biased variance)."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * gamma + beta


def position_bucket(distance: np.ndarray, num_buckets: int, max_seq_len: int) -> np.ndarray:
    """Distance d >= 0 -> bucket: d itself below half the buckets, then log-spaced so that distance
    max_seq_len + 1 would land exactly one past the last bucket (clipped to the last)."""
    exact = num_buckets // 2
    d = np.asarray(distance, np.float64)
    log_part = exact + np.floor((num_buckets - 1 - exact) * np.log(np.maximum(d, 1.0) / exact)
                                / np.log((max_seq_len + 1) / exact))
    return np.where(d < exact, d, np.minimum(log_part, num_buckets - 1)).astype(np.int64)


def time_bucket(dt_seconds: np.ndarray, num_buckets: int, scale: float) -> np.ndarray:
    """floor(log1p(|dt|) * scale), clipped to the last bucket; dt in whole seconds (int64, exact)."""
    dt = np.abs(np.asarray(dt_seconds, np.int64)).astype(np.float64)
    return np.minimum(np.floor(np.log1p(dt) * scale), num_buckets - 1).astype(np.int64)


@dataclass(frozen=True)
class Tokens:
    """One request laid out as the design says: [user token | events | candidates]."""

    item_ids: np.ndarray  # [T]
    action_ids: np.ndarray  # [T]
    positions: np.ndarray  # [T] absolute positions
    times: np.ndarray  # [T] int64 unix seconds
    num_history: int  # N: user token (if any) + events; the candidates follow
    user_embedding: np.ndarray | None  # [d], added to token 0 when there is a user token


@dataclass(frozen=True)
class OracleOutput:
    logits: np.ndarray  # [M, tasks]
    history_states: np.ndarray  # [N, d] final-normed states of the history tokens (user token first)
    candidate_states: np.ndarray  # [M, d] final-normed states of the candidates


class HSTUOracle:
    """The HSTU forward of docs/design.md in float64 numpy, on a network's weights."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray]) -> None:
        self.cfg = cfg
        # Parameter names carry the prefix of the cell that first held the net ("net."): drop it.
        self.w = {name.split("net.", 1)[-1]: np.asarray(v, np.float64) for name, v in weights.items()}
        self.q_scale = 1.0 / np.sqrt(cfg.d_qk) if cfg.qk_scale is None else float(cfg.qk_scale)

    # ---------------------------------------------------------------- layout
    def tokens(self, history: Mapping[str, Any], candidate_ids: Sequence[int]) -> Tokens:
        cfg = self.cfg
        items = np.asarray(history["item_ids"], np.int64)
        actions = np.asarray(history["action_ids"], np.int64)
        times = np.asarray(history["timestamps"], np.int64)
        cands = np.asarray(candidate_ids, np.int64)
        user = None
        if cfg.user_feature_sizes:
            # The user token: item 0, the "user/context" action, the first event's time; its embedding adds
            # every user feature's row of the one user table (features laid out one after the other).
            feats = history.get("user_features")
            feats = np.zeros(len(cfg.user_feature_sizes), np.int64) if feats is None else np.asarray(feats)
            offsets = np.concatenate([[0], np.cumsum(cfg.user_feature_sizes)[:-1]])
            user = self.w["user_table"][feats + offsets].sum(0)
            items = np.concatenate([[0], items])
            actions = np.concatenate([[cfg.num_actions], actions])
            times = np.concatenate([times[:1] if len(times) else [0], times])
        n = len(items)
        # Candidates: the "candidate" action, one shared position right after the last history token and
        # the last event's time, so their scores do not depend on their order.
        last_time = times[-1] if len(times) else 0
        return Tokens(
            item_ids=np.concatenate([items, cands]),
            action_ids=np.concatenate([actions, np.full(len(cands), cfg.num_actions + 1)]),
            positions=np.concatenate([np.arange(n), np.full(len(cands), n)]),
            times=np.concatenate([times, np.full(len(cands), last_time)]).astype(np.int64),
            num_history=n,
            user_embedding=user,
        )

    def embed(self, tok: Tokens) -> np.ndarray:
        """Item + action + absolute position embedding (+ the user features on the user token)."""
        w = self.w
        pos = np.minimum(tok.positions, self.cfg.max_seq_len)  # the table has max_seq_len + 1 rows
        x = w["item_table"][tok.item_ids] + w["action_table"][tok.action_ids] + w["pos_table"][pos]
        if tok.user_embedding is not None:
            x[0] = x[0] + tok.user_embedding
        return x

    @staticmethod
    def visible(tok: Tokens) -> np.ndarray:
        """[T, T] who attends to whom: causal over history tokens; a candidate sees every history token and
        itself, never another candidate (M-FALCON)."""
        t, n = len(tok.item_ids), tok.num_history
        seen = np.zeros((t, t), bool)
        seen[:n, :n] = np.tril(np.ones((n, n), bool))
        seen[n:, :n] = True
        seen[n:, n:] = np.eye(t - n, dtype=bool)
        return seen

    def bias(self, tok: Tokens) -> np.ndarray:
        """rab(pos, time) [h, T, T] of every (query, key) pair, from the one table shared by all layers."""
        cfg = self.cfg
        distance = np.maximum(tok.positions[:, None] - tok.positions[None, :], 0)
        dt = tok.times[:, None] - tok.times[None, :]
        column = (time_bucket(dt, cfg.num_time_buckets, cfg.time_bucket_scale) * cfg.num_pos_buckets
                  + position_bucket(distance, cfg.num_pos_buckets, cfg.max_seq_len))
        return self.w["rab.table"][:, column]

    # ---------------------------------------------------------------- layers
    def layer(self, i: int, x: np.ndarray, bias: np.ndarray, visible: np.ndarray) -> np.ndarray:
        """y = x + W2 (LayerNorm(A V) * U), U, V, Q, K = SiLU(W1 LayerNorm(x) + b1),
        A = SiLU(Q K^T * qk_scale + rab) / N_norm on visible pairs, 0 elsewhere."""
        w = {k.split(f"layers.{i}.", 1)[1]: v for k, v in self.w.items() if k.startswith(f"layers.{i}.")}
        xn = layer_norm(x, w["input_norm.gamma"], w["input_norm.beta"])
        u = silu(xn @ w["w_u.weight"].T + w["w_u.bias"])  # [T, h * dv], head g in columns [g dv, (g + 1) dv)
        heads = []
        for g in range(self.cfg.num_heads):
            v = silu(xn @ w["w_v"][g] + w["b_v"][g, 0])
            q = silu(xn @ w["w_q"][g] + w["b_q"][g, 0])
            k = silu(xn @ w["w_k"][g] + w["b_k"][g, 0])
            a = np.where(visible, silu(q @ k.T * self.q_scale + bias[g]), 0.0) / self.cfg.max_seq_len
            heads.append(a @ v)
        gated = layer_norm(np.concatenate(heads, axis=1), w["norm.gamma"], w["norm.beta"]) * u
        return x + gated @ w["out.weight"].T + w["out.bias"]

    def forward(self, history: Mapping[str, Any], candidate_ids: Sequence[int]) -> OracleOutput:
        """Logits [M, tasks] of the candidates after `history` (a dict of item_ids, action_ids, timestamps
        and, with a user token, user_features), and the final-normed states."""
        tok = self.tokens(history, candidate_ids)
        x = self.embed(tok)
        bias, visible = self.bias(tok), self.visible(tok)
        for i in range(self.cfg.num_layers):
            x = self.layer(i, x, bias, visible)
        z = layer_norm(x, self.w["final_norm.gamma"], self.w["final_norm.beta"])
        n = tok.num_history
        user, cands = z[n - 1], z[n:]
        # engage: cos(user state = the last history token's state, candidate item embedding) / temperature
        items = self.w["item_table"][tok.item_ids[n:]]
        engage = items @ user / (np.linalg.norm(items, axis=1) * np.linalg.norm(user)) / self.cfg.score_temperature
        columns = [engage[:, None]]
        if len(self.cfg.task_names) > 1:  # the other tasks: a linear head on each candidate's own state
            columns.append(cands @ self.w["head.weight"].T + self.w["head.bias"])
        return OracleOutput(np.concatenate(columns, axis=1), z[:n], cands)

    def logits(self, history: Mapping[str, Any], candidate_ids: Sequence[int]) -> np.ndarray:
        return self.forward(history, candidate_ids).logits
