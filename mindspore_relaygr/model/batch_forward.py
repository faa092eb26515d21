"""Batched HSTU forward over padded sequences: the training graph.

The serving graphs run one request at a time on the model's backend; training runs B sequences at once on
the plain backend (`PlainOps`: MindSpore ops, which have gradients) over the same `HSTUNet` parameters and
computes exactly the serving math (tests compare it with `rank_full`). A row holds T = n + C tokens: n history
tokens laid out as `RelayGRModel` lays them out (user token, events), then C candidate tokens (M-FALCON),
which attend to the history keys their bias row shows and to themselves, never to each other.

Who sees whom and with which relative (position, time) bias comes in as bucket indices computed on the host
(`model.batch_index.RabIndex`, numpy): hist_idx [B, n, n] for history queries and cand_idx [B, G, n] for G
groups of C / G candidates that share their query position and time (a cut of the history: all candidates of
one request, or of one training cut); hidden pairs hold the mask index, whose bias makes SiLU exactly 0, as
in the serving graphs. The indices do not depend on the weights, so no graph op is spent on them.
Dropout (`model.dropout`, training only) acts on the input embeddings and before each layer's output
projection, as in the HSTU reference. Its masks are inputs (`model.host_dropout`: random bytes drawn on the
host, `noise_shapes` gives their shapes), so a seed fixes a run; called without them the forward has none.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops

from mindspore_relaygr.model.backend import PlainOps
from mindspore_relaygr.model.host_dropout import apply_dropout, dropout_threshold
from mindspore_relaygr.model.hstu import HSTULayer, take
from mindspore_relaygr.model.network import HSTUNet


class BatchForward(nn.Cell):
    """(tokens [B, T], bias indices) -> final-normed hidden states [B, T, d]."""

    def __init__(self, net: HSTUNet, dropout: float) -> None:
        super().__init__(auto_prefix=False)  # the net's parameter names stay the checkpoint keys
        self.net = net
        self.backend = PlainOps()  # training always runs plain ops: the fused kernels have no gradient
        self.threshold, self.scale = dropout_threshold(dropout)
        # Dropout sites: the input embeddings [.., d], then each layer's gated attention output [.., h * d_v].
        self.site_widths = [int(net.item_table.shape[1])] + [x.num_heads * x.parts["u"][1] for x in net.layers]
        rab = net.rab
        self.num_heads = rab.num_heads
        # Flat index of (head g, bucket b) in the masked [h, buckets + 1] table.
        offsets = np.arange(rab.num_heads) * (rab.mask_index + 1)
        self.head_offsets = Tensor(offsets.reshape(1, -1, 1, 1).astype(np.int32))

    def noise_shapes(self, rows: int, tokens: int) -> list[tuple[int, ...]]:
        """Shapes of the dropout noise of a [rows, tokens] batch: the input embeddings, then each layer's
        gated attention output; [] when the rate is 0."""
        return [] if self.threshold == 0 else [(rows, tokens, w) for w in self.site_widths]

    def construct(self, item_ids, action_ids, pos, user_feats, user_row, valid, hist_idx, cand_idx, *noise):
        """item_ids, action_ids, pos [B, T] int32; user_row [B, T] float32; valid [B, T] bool; user_feats [B, F]
        int32 (offset ids, as the serving graphs take them); hist_idx [B, n, n], cand_idx [B, G, n] int32;
        noise: none, or uint8 arrays of `noise_shapes(B, T)`."""
        x = self.net.embed(item_ids, action_ids, pos)  # [B, T, d]
        user = ops.sum(ops.gather(self.net.user_table, user_feats, 0), 1, keepdim=True)  # [B, 1, d]
        x = x + ops.expand_dims(user_row, -1) * user
        x = self.drop(x, noise, 0) * ops.expand_dims(ops.cast(valid, x.dtype), -1)
        flat = ops.reshape(self.net.rab.masked_table(), (-1,))
        hist_bias = ops.gather(flat, ops.expand_dims(hist_idx, 1) + self.head_offsets, 0)  # [B, h, n, n]
        cand_bias = ops.gather(flat, ops.expand_dims(cand_idx, 1) + self.head_offsets, 0)  # [B, h, G, n]
        self_bias = ops.reshape(self.net.rab.self_bias(), (1, self.num_heads, 1))  # rab(0, 0) [1, h, 1]
        for i, layer in enumerate(self.net.layers):
            x = self.layer(layer, x, hist_bias, cand_bias, self_bias, self.noise_at(noise, i + 1))
        return self.net.final_norm(x)

    def noise_at(self, noise, i: int):
        """The noise of dropout site i, or None without noise."""
        return noise[i] if noise else None

    def drop(self, x, noise, i: int):
        return apply_dropout(x, self.noise_at(noise, i), self.threshold, self.scale)

    def layer(self, layer: HSTULayer, x, hist_bias, cand_bias, self_bias, noise):
        """One HSTU layer on [B, T, d] with the per-head weights (gradients reach them)."""
        b, t, d = x.shape
        n = hist_bias.shape[2]
        y = ops.reshape(self.backend.project(layer, ops.reshape(x, (b * t, d))), (b, t, -1))  # [B, T, W]
        q = self._heads(layer, y, "q") * layer.q_scale
        k = self._heads(layer, y, "k")
        v = self._heads(layer, y, "v")
        k_hist, v_hist = take(k, 0, n, 2), take(v, 0, n, 2)
        k_hist_t = ops.transpose(k_hist, (0, 1, 3, 2))
        v_hist = v_hist * self.net.inv_norm  # N_norm applied to V: one small op instead of one per score
        av = ops.matmul(ops.silu(ops.matmul(take(q, 0, n, 2), k_hist_t) + hist_bias), v_hist)  # [B, h, n, dv]
        if t > n:  # candidates: the history keys their group's bias row shows, plus themselves
            q_c, k_c, v_c = take(q, n, t, 2), take(k, n, t, 2), take(v, n, t, 2)
            h, groups = self.num_heads, cand_bias.shape[2]
            scores = ops.reshape(ops.matmul(q_c, k_hist_t), (b, h, groups, (t - n) // groups, n))
            scores = ops.reshape(scores + ops.expand_dims(cand_bias, 3), (b, h, t - n, n))
            own_w = ops.silu(ops.sum(q_c * k_c, -1) + self_bias) * self.net.inv_norm  # [B, h, C]
            av_c = ops.matmul(ops.silu(scores), v_hist) + ops.expand_dims(own_w, -1) * v_c
            av = ops.concat((av, av_c), axis=2)
        av = ops.reshape(ops.transpose(av, (0, 2, 1, 3)), (b, t, -1))  # [B, T, h*dv]
        first, width = layer.parts["u"]
        u = take(y, first, first + self.num_heads * width, 2)
        return x + layer.out(apply_dropout(layer.norm(av) * u, noise, self.threshold, self.scale))

    def _heads(self, layer: HSTULayer, y, name: str):
        """One part of y [B, T, W] head-major: [B, h, T, width]."""
        first, width = layer.parts[name]
        part = take(y, first, first + self.num_heads * width, 2)
        return ops.transpose(ops.reshape(part, (y.shape[0], y.shape[1], self.num_heads, width)), (0, 2, 1, 3))
