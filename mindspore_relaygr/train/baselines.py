"""Baselines on the same split and candidates as the ranker: popularity and a SASRec-style transformer.

SASRec (Kang & McAuley, 2018), small and in MindSpore: item + learned position embeddings, pre-LayerNorm
blocks of causal softmax self-attention and a ReLU feed-forward, dropout (training only). Trained with the
recipe of Meta's generative-recommenders: every position of every (left-padded) training sequence predicts
its next item with a sampled softmax (`losses.sampled_softmax_loss`) against `train.num_negatives` item ids
drawn uniformly per sequence and step (accidental hits masked), query and item embeddings L2-normalised,
temperature 0.05; the output side uses the input item table (tied). Batches of `train.sasrec_batch_size`
users, Adam (betas 0.9 / 0.98, no weight decay). Scoring: the cosine of the last position's hidden state with
every item embedding. One graph shape for training and one for scoring.

Dropout masks come from random bytes drawn on the host (`model.host_dropout`, `SASRecTrainer.dropout_noise`),
so a seed fixes a run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import TrainConfig
from mindspore_relaygr.data.sequences import EvalExample, PopularityModel
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.eval_filter import REFERENCE_FILTER
from mindspore_relaygr.train.metrics import full_ranking_ranks, ranking_metrics_at
from mindspore_relaygr.train.negatives import negative_weights

logger = logging.getLogger(__name__)

__all__ = ["NextItemTarget", "PopularityModel", "SASRecTrainer", "as_target", "left_pad"]
MASKED = -1.0e9
SELECT_BY = "ndcg@10"  # validation metric of the best epoch


def left_pad(items: np.ndarray, length: int) -> np.ndarray:
    """The last `length` ids of `items`, left-padded with 0 to int32 [length]."""
    tail = np.asarray(items, np.int32)[-length:] if length else np.zeros(0, np.int32)
    return np.pad(tail, (length - len(tail), 0)).astype(np.int32)


@dataclass(frozen=True)
class NextItemTarget:
    """A full-ranking evaluation case: the history and the item that followed it."""

    history: History
    target_id: int
    earlier_items: np.ndarray | None = None  # every earlier item (uncapped) the filter reads; None: the history's

    def excluded(self) -> np.ndarray:
        """The items the reference filter removes from this case's ranking."""
        return REFERENCE_FILTER.excluded(self.history.item_ids if self.earlier_items is None else self.earlier_items)


def as_target(case: Any) -> NextItemTarget:
    """NextItemTarget from a NextItemTarget, an EvalExample (`.target_id`), a sequences.Target (`.item_id`)
    or a (History, item id) pair."""
    if isinstance(case, NextItemTarget):
        return case
    if isinstance(case, tuple):
        history, target = case
        return NextItemTarget(history, int(target))
    if hasattr(case, "target_id"):
        return NextItemTarget(case.history, int(case.target_id), case.earlier_items)
    return NextItemTarget(case.history, int(case.item_id))  # a sequences.Target: its history is uncapped


def _build_cells(num_items: int, tc: TrainConfig, temperature: float) -> tuple[Any, Any, Any]:
    """(SASRec net, training loss cell, full-scoring cell); MindSpore is imported here, not at module import."""
    from mindspore import Parameter, Tensor, nn, ops
    from mindspore import dtype as mstype
    from mindspore.common.initializer import Normal, XavierUniform, initializer

    from mindspore_relaygr.model.host_dropout import apply_dropout, dropout_threshold
    from mindspore_relaygr.train.losses import l2_normalize, sampled_softmax_loss

    d, num_heads, length = tc.sasrec_d_model, tc.sasrec_num_heads, tc.sasrec_max_len
    causal = np.triu(np.full((length, length), MASKED, np.float32), k=1)  # key j > query i is hidden
    threshold, scale = dropout_threshold(tc.sasrec_dropout)

    def drop(x, noise):  # see model.host_dropout; noise None: identity
        return apply_dropout(x, noise, threshold, scale)

    class Block(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm((d,), epsilon=1e-8), nn.LayerNorm((d,), epsilon=1e-8)
            self.q, self.k, self.v, self.o = (nn.Dense(d, d) for _ in range(4))
            self.ff1, self.ff2 = nn.Dense(d, d), nn.Dense(d, d)
            self.causal = Tensor(causal)
            self.scale = 1.0 / math.sqrt(d // num_heads)

        def split_heads(self, x):  # [B, L, d] -> [B, h, L, d/h]
            return ops.transpose(ops.reshape(x, (x.shape[0], length, num_heads, d // num_heads)), (0, 2, 1, 3))

        def construct(self, x, key_bias, n_attn=None, n_o=None, n_ff1=None, n_ff2=None):
            # x [B, L, d], key_bias [B, 1, 1, L] (0 or MASKED); dropout noise: n_attn [B, h, L, L], others [B, L, d]
            h = self.norm1(x)
            scores = ops.matmul(self.split_heads(self.q(h)), ops.transpose(self.split_heads(self.k(h)), (0, 1, 3, 2)))
            attn = drop(ops.softmax(scores * self.scale + self.causal + key_bias, -1), n_attn)
            av = ops.reshape(ops.transpose(ops.matmul(attn, self.split_heads(self.v(h))), (0, 2, 1, 3)), x.shape)
            x = x + drop(self.o(av), n_o)
            return x + drop(self.ff2(drop(ops.relu(self.ff1(self.norm2(x))), n_ff1)), n_ff2)

    class SASRec(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.items = Parameter(initializer(XavierUniform(), (num_items + 1, d), mstype.float32), name="items")
            self.positions = Parameter(initializer(Normal(0.02), (length, d), mstype.float32), name="positions")
            self.blocks = nn.CellList([Block() for _ in range(tc.sasrec_num_layers)])
            self.norm = nn.LayerNorm((d,), epsilon=1e-8)

        def construct(self, seq, *noise):
            # seq [B, L] int32, left-padded -> hidden [B, L, d]. With noise (training): dropout, see `dropout_noise`.
            keep = ops.expand_dims(ops.cast(seq > 0, mstype.float32), -1)
            x = ops.gather(self.items, seq, 0) * math.sqrt(d) + self.positions
            x = (drop(x, noise[0]) if noise else x) * keep
            key_bias = ops.reshape((1.0 - keep) * MASKED, (seq.shape[0], 1, 1, length))
            for i, block in enumerate(self.blocks):
                x = (block(x, key_bias, *noise[4 * i + 1:4 * i + 5]) if noise else block(x, key_bias)) * keep
            return self.norm(x)

    class Loss(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net = net

        def construct(self, seq, pos, neg, neg_weight, *noise):
            # seq, pos [B, L] (pos == 0: no target); neg [B, P] pool; neg_weight [B, L, P] (train.negatives)
            h = self.net(seq, *noise)
            return sampled_softmax_loss(h, ops.gather(self.net.items, pos, 0), ops.gather(self.net.items, neg, 0),
                                        pos, neg, temperature, neg_weight)

    class ScoreAll(nn.Cell):
        def __init__(self, net: nn.Cell) -> None:
            super().__init__()
            self.net = net

        def construct(self, seq):  # seq [B, L] -> cosines [B, num_items + 1]
            h = self.net(seq)
            last = l2_normalize(ops.reshape(ops.slice(h, (0, length - 1, 0), (h.shape[0], 1, d)), (h.shape[0], d)))
            return ops.matmul(last, ops.transpose(l2_normalize(self.net.items), (1, 0)))

    net = SASRec()
    return net, Loss(net), ScoreAll(net)


class SASRecTrainer:
    """Trains the SASRec-style baseline on training sequences and scores histories against every item."""

    def __init__(self, tc: TrainConfig, num_items: int, seed: int = 0,
                 progress: Callable[[str], None] | None = None, temperature: float = 0.05) -> None:
        import mindspore as ms
        from mindspore import nn

        from mindspore_relaygr.train.losses import MIN_TEMPERATURE

        if not temperature >= MIN_TEMPERATURE:
            raise ValueError(f"temperature must be >= {MIN_TEMPERATURE} (the sampled softmax underflows below), "
                             f"got {temperature}")
        ms.set_seed(seed)
        self.tc, self.num_items, self.temperature = tc, num_items, temperature
        self.rng = np.random.default_rng([seed, 1])  # epoch order and negatives
        self.dropout_rng = np.random.default_rng([seed, 2])  # dropout masks
        self.progress = progress or (lambda msg: logger.info("%s", msg))
        self.net, loss, self.score_cell = _build_cells(num_items, tc, temperature)
        # nn.Adam, not nn.AdamWeightDecay: MindSpore's AdamWeightDecay has no bias correction (its first step
        # is 0.71 lr here, not lr) and adds eps outside the square root; with weight decay 0, nn.Adam is the
        # reference's torch AdamW update exactly.
        optimizer = nn.Adam(self.net.trainable_params(), learning_rate=tc.sasrec_lr, beta1=0.9, beta2=0.98,
                            weight_decay=0.0)
        self.step_cell = nn.TrainOneStepCell(loss, optimizer)
        self.losses: list[float] = []  # mean training loss per epoch
        self.evals: list[dict[str, float]] = []  # per validation: epoch, loss, hr@k / ndcg@k / mrr, seconds
        self.best: dict[str, float] | None = None  # the entry of `evals` whose parameters were kept

    def _batch(self, seqs: Sequence[History]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(input [batch, L], targets [batch, L], negative pool [batch, P] int32, each position's draws of K of
        the pool as weights [batch, L, P] (`train.negatives`)), as the HSTU trainer samples them; rows past
        len(seqs) are padding."""
        length, size = self.tc.sasrec_max_len, self.tc.sasrec_batch_size
        seq, pos = np.zeros((size, length), np.int32), np.zeros((size, length), np.int32)
        for row, history in enumerate(seqs):
            items = history.item_ids  # the last L + 1 events: inputs all but the last, targets all but the first
            seq[row] = left_pad(items[:-1], length)
            pos[row] = left_pad(items[1:], length)
        neg = self.rng.integers(1, self.num_items + 1, size=(size, self.tc.negative_pool)).astype(np.int32)
        pick = self.rng.integers(0, self.tc.negative_pool, size=(size, length, self.tc.num_negatives))
        return seq, pos, neg, negative_weights(pick, pos, neg)

    def dropout_noise(self) -> tuple[np.ndarray, ...]:
        """One step's dropout noise, uniform random uint8 per dropout site: the embedding [batch, L, d], then per
        block the attention weights [batch, heads, L, L] and the attention output, first and second
        feed-forward layers [batch, L, d]; () without dropout. Drawn on the host from a seeded generator
        (MindSpore's CPU Dropout kernel fills its mask from several threads sharing one generator, so seeded
        runs with it differ after a few steps, and one nn.Dropout applied at several sites repeats its mask)."""
        from mindspore_relaygr.model.host_dropout import dropout_noise, dropout_threshold

        tc = self.tc
        if dropout_threshold(tc.sasrec_dropout)[0] == 0:
            return ()
        hidden = (tc.sasrec_batch_size, tc.sasrec_max_len, tc.sasrec_d_model)
        attn = (tc.sasrec_batch_size, tc.sasrec_num_heads, tc.sasrec_max_len, tc.sasrec_max_len)
        shapes = [hidden] + [attn, hidden, hidden, hidden] * tc.sasrec_num_layers
        return dropout_noise(self.dropout_rng, shapes)

    def fit(self, train: Mapping[int, History], valid: Iterable[Any] | None = None, eval_every: int = 1,
            progress: Callable[[str], None] | None = None, patience: int | None = None,
            after_validation: Callable[[SASRecTrainer, bool], None] | None = None) -> SASRecTrainer:
        """Up to `train.sasrec_epochs` epochs over the users with >= 2 training events, in shuffled batches.

        `valid`: cases with a history and the next item (see `as_target`). Every `eval_every` epochs (and
        after the last) they are ranked against all items (the reference filter: the items of the 200 most
        recent earlier events removed); the parameters of the epoch with the best NDCG@10 are kept and restored
        at the end; with `patience`, training stops after that many validations without a better NDCG@10 (as
        the HSTU trainer). Metrics per validation go to
        `self.evals`. `after_validation(self, improved)` runs after each validation (the network holds that
        epoch's weights), e.g. to checkpoint the best epoch so far."""
        from mindspore import Tensor

        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        say = progress or self.progress
        cases = None if valid is None else [as_target(c) for c in valid]
        users = [uid for uid in sorted(train) if len(train[uid]) >= 2]
        size, epochs = self.tc.sasrec_batch_size, self.tc.sasrec_epochs
        best_params: dict[str, np.ndarray] | None = None
        for epoch in range(1, epochs + 1):
            self.step_cell.set_train(True)
            order = self.rng.permutation(len(users))
            t0, tokens, batch_losses = time.perf_counter(), 0, []
            for start in range(0, len(users), size):
                seq, pos, neg, neg_weight = self._batch([train[users[i]] for i in order[start:start + size]])
                tokens += int((pos > 0).sum())
                inputs = (seq, pos, neg, neg_weight, *self.dropout_noise())
                batch_losses.append(float(self.step_cell(*(Tensor(a) for a in inputs)).asnumpy()))
            seconds = time.perf_counter() - t0
            self.losses.append(float(np.mean(batch_losses)) if batch_losses else float("nan"))
            line = (f"SASRec epoch {epoch}/{epochs} loss {self.losses[-1]:.4f} {seconds:.1f} s "
                    f"{tokens / max(seconds, 1e-9):.0f} tokens/s")
            if cases and (epoch % eval_every == 0 or epoch == epochs):
                t0 = time.perf_counter()
                entry = {"epoch": epoch, "loss": self.losses[-1], **self.evaluate(cases)}
                entry["seconds"] = time.perf_counter() - t0
                self.evals.append(entry)
                line += f"; valid HR@10 {entry['hr@10']:.4f} NDCG@10 {entry['ndcg@10']:.4f}"
                improved = self.best is None or entry[SELECT_BY] > self.best[SELECT_BY]
                if improved:
                    self.best, best_params = entry, self._parameters()
                    line += " (best)"
                if after_validation is not None:
                    after_validation(self, improved)
            say(line)
            if patience is not None and self.best is not None and \
                    sum(1 for e in self.evals if e["epoch"] > self.best["epoch"]) >= patience:
                say(f"SASRec: early stop after epoch {epoch}: no better validation NDCG@10 in {patience} validations")
                break
        if best_params is not None:
            self._load_parameters(best_params)
            say(f"SASRec: kept epoch {self.best['epoch']} (valid NDCG@10 {self.best['ndcg@10']:.4f})")
        self.net.set_train(False)
        return self

    def save(self, path: str | Path) -> None:
        """The network's weights (the kept epoch's after `fit`) as a MindSpore checkpoint."""
        import mindspore as ms

        ms.save_checkpoint(self.net, str(path))

    def load(self, path: str | Path) -> SASRecTrainer:
        """Weights saved by `save` from a trainer of the same config; every parameter must be present."""
        import mindspore as ms

        params = ms.load_checkpoint(str(path))
        missing = sorted(p.name for p in self.net.trainable_params() if p.name not in params)
        if missing:
            raise ValueError(f"{path} is not a SASRec checkpoint of this config: missing {missing[:3]}")
        for p in self.net.trainable_params():
            if tuple(params[p.name].shape) != tuple(p.shape):
                raise ValueError(f"{path}: {p.name} has shape {tuple(params[p.name].shape)}, the config's SASRec "
                                 f"{tuple(p.shape)}")
        ms.load_param_into_net(self.net, params)
        self.net.set_train(False)
        return self

    def _parameters(self) -> dict[str, np.ndarray]:
        return {p.name: p.asnumpy().copy() for p in self.net.trainable_params()}

    def _load_parameters(self, values: Mapping[str, np.ndarray]) -> None:
        from mindspore import Tensor

        for p in self.net.trainable_params():
            p.set_data(Tensor(values[p.name].copy()))

    def score_all(self, histories: Sequence[History]) -> np.ndarray:
        """float32 [B, num_items + 1]: cosine of each history's last hidden state with every item embedding
        (both L2-normalised); column 0 (padding) is -inf. Histories keep their last `sasrec_max_len` events."""
        from mindspore import Tensor

        self.net.set_train(False)
        size, length = self.tc.sasrec_batch_size, self.tc.sasrec_max_len
        out = np.empty((len(histories), self.num_items + 1), np.float32)
        for start in range(0, len(histories), size):
            chunk = histories[start:start + size]
            seq = np.zeros((size, length), np.int32)
            for row, history in enumerate(chunk):
                seq[row] = left_pad(history.item_ids, length)
            out[start:start + len(chunk)] = self.score_cell(Tensor(seq)).asnumpy()[:len(chunk)]
        out[:, 0] = -np.inf
        return out

    def evaluate(self, cases: Iterable[Any], ks: Sequence[int] = (10, 50, 200)) -> dict[str, float]:
        """Full-ranking HR@k / NDCG@k / MRR of the cases' targets (see `as_target`), the items of each user's
        200 most recent earlier events removed from the ranking (the reference filter)."""
        targets = [as_target(c) for c in cases]
        ranks = []
        step = 4 * self.tc.sasrec_batch_size  # bounds the [rows, num_items + 1] score block
        for start in range(0, len(targets), step):
            chunk = targets[start:start + step]
            scores = self.score_all([c.history for c in chunk])
            ranks.append(full_ranking_ranks(scores, np.array([c.target_id for c in chunk]),
                                            [c.excluded() for c in chunk]))
        return ranking_metrics_at(np.concatenate(ranks) if ranks else np.zeros(0, np.int64), ks)

    def score(self, examples: Sequence[EvalExample]) -> np.ndarray:
        """float64 [B, C]: the `score_all` columns of every example's candidates."""
        step = 4 * self.tc.sasrec_batch_size
        rows = []
        for start in range(0, len(examples), step):
            chunk = examples[start:start + step]
            full = self.score_all([e.history for e in chunk])
            rows.append(np.take_along_axis(full, np.stack([e.candidate_ids for e in chunk]).astype(np.int64), 1))
        return np.concatenate(rows).astype(np.float64)
