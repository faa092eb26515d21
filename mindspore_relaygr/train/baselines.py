"""Baselines on the same split and candidates as the ranker: popularity and a SASRec-style transformer.

SASRec (Kang & McAuley, 2018), small and in MindSpore: item + learned position embeddings, pre-LayerNorm
blocks of causal softmax self-attention and a ReLU feed-forward, dropout; the hidden state at position t
scores item i by the dot product with i's embedding. Training: every position of every (left-padded)
training sequence predicts the next item against one sampled negative the user never rated (BCE),
batches of `train.sasrec_batch_size` users, Adam. One graph shape for training and one for scoring.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mindspore_relaygr.config import TrainConfig
from mindspore_relaygr.data.sequences import EvalExample, PopularityModel, sample_negatives
from mindspore_relaygr.model.inputs import History

logger = logging.getLogger(__name__)

__all__ = ["PopularityModel", "SASRecTrainer", "left_pad"]
MASKED = -1.0e9


def left_pad(items: np.ndarray, length: int) -> np.ndarray:
    """The last `length` ids of `items`, left-padded with 0 to int32 [length]."""
    tail = np.asarray(items, np.int32)[-length:] if length else np.zeros(0, np.int32)
    return np.pad(tail, (length - len(tail), 0)).astype(np.int32)


def _build_cells(num_items: int, tc: TrainConfig) -> tuple[Any, Any, Any]:
    """(SASRec net, training loss cell, scoring cell); MindSpore is imported here, not at module import."""
    from mindspore import Parameter, Tensor, nn, ops
    from mindspore import dtype as mstype
    from mindspore.common.initializer import Normal, XavierUniform, initializer

    d, num_heads, length = tc.sasrec_d_model, tc.sasrec_num_heads, tc.sasrec_max_len
    causal = np.triu(np.full((length, length), MASKED, np.float32), k=1)  # key j > query i is hidden

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm((d,), epsilon=1e-8), nn.LayerNorm((d,), epsilon=1e-8)
            self.q, self.k, self.v, self.o = (nn.Dense(d, d) for _ in range(4))
            self.ff1, self.ff2 = nn.Dense(d, d), nn.Dense(d, d)
            self.drop = nn.Dropout(p=tc.sasrec_dropout)
            self.causal = Tensor(causal)
            self.scale = 1.0 / math.sqrt(d // num_heads)

        def split_heads(self, x):  # [B, L, d] -> [B, h, L, d/h]
            return ops.transpose(ops.reshape(x, (x.shape[0], length, num_heads, d // num_heads)), (0, 2, 1, 3))

        def construct(self, x, key_bias):  # x [B, L, d], key_bias [B, 1, 1, L] (0 or MASKED)
            h = self.norm1(x)
            scores = ops.matmul(self.split_heads(self.q(h)), ops.transpose(self.split_heads(self.k(h)), (0, 1, 3, 2)))
            attn = self.drop(ops.softmax(scores * self.scale + self.causal + key_bias, -1))
            av = ops.reshape(ops.transpose(ops.matmul(attn, self.split_heads(self.v(h))), (0, 2, 1, 3)), x.shape)
            x = x + self.drop(self.o(av))
            return x + self.drop(self.ff2(self.drop(ops.relu(self.ff1(self.norm2(x))))))

    class SASRec(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.items = Parameter(initializer(XavierUniform(), (num_items + 1, d), mstype.float32), name="items")
            self.positions = Parameter(initializer(Normal(0.02), (length, d), mstype.float32), name="positions")
            self.blocks = nn.CellList([Block() for _ in range(tc.sasrec_num_layers)])
            self.drop = nn.Dropout(p=tc.sasrec_dropout)
            self.norm = nn.LayerNorm((d,), epsilon=1e-8)

        def construct(self, seq):  # seq [B, L] int32, left-padded -> hidden [B, L, d]
            keep = ops.expand_dims(ops.cast(seq > 0, mstype.float32), -1)
            x = self.drop(ops.gather(self.items, seq, 0) * math.sqrt(d) + self.positions) * keep
            key_bias = ops.reshape((1.0 - keep) * MASKED, (seq.shape[0], 1, 1, length))
            for block in self.blocks:
                x = block(x, key_bias) * keep
            return self.norm(x)

    class Loss(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net = net

        def construct(self, seq, pos, neg):  # [B, L] each; pos == 0 marks positions without a target
            h = self.net(seq)
            pos_logit = ops.reduce_sum(h * ops.gather(self.net.items, pos, 0), -1)
            neg_logit = ops.reduce_sum(h * ops.gather(self.net.items, neg, 0), -1)
            mask = ops.cast(pos > 0, mstype.float32)
            # -log sigmoid(p) - log(1 - sigmoid(n)) = softplus(-p) + softplus(n), written stably.
            loss = ops.softplus(-pos_logit) + ops.softplus(neg_logit)
            return ops.reduce_sum(loss * mask) / ops.maximum(ops.reduce_sum(mask), 1.0)

    class Score(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net = net

        def construct(self, seq, cands):  # seq [B, L], cands [B, C] -> scores [B, C]
            h = self.net(seq)
            last = ops.slice(h, (0, length - 1, 0), (h.shape[0], 1, d))  # [B, 1, d]
            return ops.reduce_sum(ops.gather(self.net.items, cands, 0) * last, -1)

    net = SASRec()
    return net, Loss(net), Score(net)


class SASRecTrainer:
    """Trains the SASRec-style baseline on training sequences and scores evaluation examples."""

    def __init__(self, tc: TrainConfig, num_items: int, seed: int = 0,
                 progress: Callable[[str], None] | None = None) -> None:
        import mindspore as ms
        from mindspore import nn

        ms.set_seed(seed)
        self.tc, self.num_items = tc, num_items
        self.rng = np.random.default_rng([seed, 1])
        self.progress = progress or (lambda msg: logger.info("%s", msg))
        self.net, loss, self.score_cell = _build_cells(num_items, tc)
        optimizer = nn.Adam(self.net.trainable_params(), learning_rate=tc.sasrec_lr, beta1=0.9, beta2=0.98)
        self.step_cell = nn.TrainOneStepCell(loss, optimizer)
        self.losses: list[float] = []

    def _batch(self, seqs: Sequence[History]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input, positive, negative) int32 [batch, L]; rows past len(seqs) are all padding."""
        length, size = self.tc.sasrec_max_len, self.tc.sasrec_batch_size
        out = np.zeros((3, size, length), np.int32)
        for row, seq in enumerate(seqs):
            items = seq.item_ids
            out[0, row] = left_pad(items[:-1], length)
            out[1, row] = left_pad(items[1:], length)
            count = min(len(items) - 1, length)
            out[2, row, length - count:] = sample_negatives(self.rng, self.num_items, items, count)
        return out[0], out[1], out[2]

    def fit(self, train: Mapping[int, History]) -> SASRecTrainer:
        """`train.sasrec_epochs` epochs over the users with >= 2 training events, in shuffled batches."""
        from mindspore import Tensor

        users = [uid for uid in sorted(train) if len(train[uid]) >= 2]
        size, t0 = self.tc.sasrec_batch_size, time.perf_counter()
        self.step_cell.set_train(True)
        for epoch in range(1, self.tc.sasrec_epochs + 1):
            order = self.rng.permutation(len(users))
            epoch_losses = []
            for start in range(0, len(users), size):
                batch = self._batch([train[users[i]] for i in order[start:start + size]])
                epoch_losses.append(float(self.step_cell(*(Tensor(a) for a in batch)).asnumpy()))
            self.losses.append(float(np.mean(epoch_losses)))
            if epoch == 1 or epoch % 10 == 0 or epoch == self.tc.sasrec_epochs:
                self.progress(f"SASRec epoch {epoch}/{self.tc.sasrec_epochs} loss {self.losses[-1]:.4f} "
                              f"({time.perf_counter() - t0:.0f} s)")
        return self

    def score(self, examples: Sequence[EvalExample]) -> np.ndarray:
        """Dot-product scores [B, C] of every example's candidates after its history."""
        from mindspore import Tensor

        self.net.set_train(False)
        size, length = self.tc.sasrec_batch_size, self.tc.sasrec_max_len
        rows = []
        for start in range(0, len(examples), size):
            chunk = examples[start:start + size]
            seq = np.zeros((size, length), np.int32)
            cands = np.ones((size, len(chunk[0].candidate_ids)), np.int32)
            for row, e in enumerate(chunk):
                seq[row] = left_pad(e.history.item_ids, length)
                cands[row] = e.candidate_ids
            rows.append(self.score_cell(Tensor(seq), Tensor(cands)).asnumpy()[:len(chunk)])
        return np.concatenate(rows).astype(np.float64)
