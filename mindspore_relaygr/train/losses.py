"""Training losses in MindSpore (imported by training code only, so MindSpore is imported at module top).

`sampled_softmax_loss` is the recipe of Meta's generative-recommenders (`SampledSoftmaxLoss` with
L2-normalised query and item embeddings, temperature 0.05 in their configs): every position's target is
scored against its own K uniformly sampled negatives, negatives equal to the target ("accidental hits") are
dropped from that position's softmax, and the loss is averaged over the positions that have a target.
Per-position negatives are drawn from a per-sequence pool of P sampled items (`pick`: which K of the P each
position uses), so the graph scores P items per sequence instead of gathering [N, K] embeddings; with P = K
and no `pick`, all positions of a sequence share its K negatives.
Both functions are plain tensor code, usable inside a Cell's `construct` (graph mode) and eagerly.
"""

from __future__ import annotations

from mindspore import Tensor, ops
from mindspore import dtype as mstype

__all__ = ["ACCIDENTAL_HIT_LOGIT", "l2_normalize", "sampled_softmax_loss"]

ACCIDENTAL_HIT_LOGIT = -5.0e4  # the reference's value: exp(-5e4 - max) is exactly 0 in fp32


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum(x^2, -1) + eps) along the last axis (not ops.L2Normalize: its CPU backward is slow)."""
    return x * ops.rsqrt(ops.sum(x * x, -1, keepdim=True) + eps)


def sampled_softmax_loss(query: Tensor, pos_emb: Tensor, neg_emb: Tensor, pos_ids: Tensor, neg_ids: Tensor,
                         temperature: float, pick: Tensor | None = None) -> Tensor:
    """Mean sampled-softmax loss over the positions with a target; a scalar Tensor.

    query [B, N, d]: hidden states; pos_emb [B, N, d]: each position's target embedding; neg_emb [B, P, d]:
    the sequence's pool of P sampled items; pos_ids [B, N] int (0: no target, excluded from the mean);
    neg_ids [B, P] int; pick [B, N, K] int32 in [0, P): the negatives of each position (None: all P, shared).
    Logits are cosines / temperature; a negative equal to the position's target gets logit
    ACCIDENTAL_HIT_LOGIT. Per position: logsumexp([pos, negs]) - pos.
    """
    inv_t = 1.0 / temperature
    q = l2_normalize(query)
    pos_logit = ops.reduce_sum(q * l2_normalize(pos_emb), -1) * inv_t  # [B, N]
    neg_t = ops.transpose(l2_normalize(neg_emb), (0, 2, 1))  # [B, d, K]
    neg_logits = ops.bmm(q, neg_t) * inv_t  # [B, N, P]
    hit = ops.equal(ops.expand_dims(pos_ids, 2), ops.expand_dims(neg_ids, 1))  # [B, N, P]
    neg_logits = ops.masked_fill(neg_logits, hit, ACCIDENTAL_HIT_LOGIT)
    if pick is not None:
        neg_logits = ops.gather_elements(neg_logits, 2, pick)  # [B, N, K]
    logits = ops.concat((ops.expand_dims(pos_logit, 2), neg_logits), 2)  # [B, N, 1 + K]
    top = ops.stop_gradient(ops.amax(logits, 2))  # the gradient of logsumexp does not depend on the shift
    lse = top + ops.log(ops.reduce_sum(ops.exp(logits - ops.expand_dims(top, 2)), 2))
    mask = ops.cast(pos_ids > 0, mstype.float32)
    return ops.reduce_sum((lse - pos_logit) * mask) / ops.maximum(ops.reduce_sum(mask), 1.0)
