"""Training losses in MindSpore (imported by training code only, so MindSpore is imported at module top).

`sampled_softmax_loss` is the recipe of Meta's generative-recommenders (`SampledSoftmaxLoss` with
L2-normalised query and item embeddings, temperature 0.05 in their configs): every position's target is
scored against its own K uniformly sampled negatives, negatives equal to the target ("accidental hits") are
dropped from that position's softmax, and the loss is averaged over the positions that have a target.
Per-position negatives are drawn from a per-sequence pool of P sampled items, so the graph scores P items per
sequence instead of gathering [N, K] embeddings. Which K of the P each position uses arrives as weights
[N, P] (`train.negatives.negative_weights`: how often the position drew each pool item, 0 for its
accidental hits), so the softmax over a position's K negatives is a weighted sum over the pool: no gather of
[N, K] logits and no id comparison in the graph (on CPU those two took a seventh of a training step).
Without weights all positions of a sequence share its P negatives.
Both functions are plain tensor code, usable inside a Cell's `construct` (graph mode) and eagerly.
"""

from __future__ import annotations

from mindspore import Tensor, ops
from mindspore import dtype as mstype

__all__ = ["MIN_TEMPERATURE", "l2_normalize", "sampled_softmax_loss"]

# Logits are cosines / temperature, so exp(logit - 1 / temperature) lies in [exp(-2 / t), 1]: a constant
# shift (no max over the logits) that stays a normal fp32 number for t >= 0.025 (exp(-80) ~ 1.8e-35).
MIN_TEMPERATURE = 0.025


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum(x^2, -1) + eps) along the last axis (not ops.L2Normalize: its CPU backward is slow)."""
    return x * ops.rsqrt(ops.sum(x * x, -1, keepdim=True) + eps)


def sampled_softmax_loss(query: Tensor, pos_emb: Tensor, neg_emb: Tensor, pos_ids: Tensor, neg_ids: Tensor,
                         temperature: float, neg_weight: Tensor | None = None) -> Tensor:
    """Mean sampled-softmax loss over the positions with a target; a scalar Tensor.

    query [B, N, d]: hidden states; pos_emb [B, N, d]: each position's target embedding; neg_emb [B, P, d]:
    the sequence's pool of P sampled items; pos_ids [B, N] int (0: no target, excluded from the mean);
    neg_ids [B, P] int; neg_weight [B, N, P] (any number type): how many times each position uses each pool
    item, 0 for a pool item equal to the position's target (None: every position uses all P once, accidental
    hits dropped here). Logits are cosines / temperature. Per position:
    log(exp(pos) + sum_p weight_p exp(neg_p)) - pos.
    """
    if not temperature >= MIN_TEMPERATURE:
        raise ValueError(f"temperature {temperature} is below {MIN_TEMPERATURE}: exp(-2 / temperature) underflows")
    inv_t = 1.0 / temperature
    q = l2_normalize(query)
    pos_logit = ops.reduce_sum(q * l2_normalize(pos_emb), -1) * inv_t  # [B, N]
    neg_t = ops.transpose(l2_normalize(neg_emb), (0, 2, 1))  # [B, d, P]
    neg_logits = ops.bmm(q, neg_t) * inv_t  # [B, N, P]
    if neg_weight is None:
        hit = ops.equal(ops.expand_dims(pos_ids, 2), ops.expand_dims(neg_ids, 1))  # [B, N, P]
        neg_weight = 1.0 - ops.cast(hit, mstype.float32)
    weighted = ops.cast(neg_weight, mstype.float32) * ops.exp(neg_logits - inv_t)  # [B, N, P]
    total = ops.exp(pos_logit - inv_t) + ops.reduce_sum(weighted, 2)
    lse = ops.log(total) + inv_t
    mask = ops.cast(pos_ids > 0, mstype.float32)
    return ops.reduce_sum((lse - pos_logit) * mask) / ops.maximum(ops.reduce_sum(mask), 1.0)
