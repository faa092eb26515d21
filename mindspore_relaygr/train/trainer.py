"""Training of the HSTU ranker with MindSpore (GRAPH_MODE, reference ops: the fused kernels have no gradient).

One step = one user's training sequence cut at a random point t (M-FALCON style: one forward pass scores
many candidates against one history): the history is the events before t, the candidates are the items of
events t .. t + `train.num_positives` - 1 (positives; 1 = the next item only) and `train.num_negatives`
items the user never rated. Loss = BCE of task 0 (engage: 1 for positives, 0 for negatives; the mean over
positives and the mean over negatives weigh equally) + `train.high_rating_weight` x BCE of task 1 (high
rating, on the positives only). Shapes are bucketed like serving (`model.len_buckets`,
`model.candidate_buckets`), so the train graph compiles once per length bucket. Every `train.eval_every`
epochs the ranker is validated (HR@10, NDCG@10 via `rank_full`) and the best checkpoint by NDCG@10 is kept.

Output directory: `config.yaml` (resolved), `best.ckpt`, `train_metrics.json`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig, save_config
from mindspore_relaygr.data.sequences import HIGH_RATING_ACTION, cap_history, sample_negatives
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.model.inputs import History
from mindspore_relaygr.train.dataset import PreparedData, prepare_data
from mindspore_relaygr.train.feeds import full_inputs

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
CHECKPOINT_NAME = "best.ckpt"
CONFIG_NAME = "config.yaml"
METRICS_NAME = "train_metrics.json"
ENGAGE, HIGH_RATING = 0, 1  # task columns of the head


def _loss_cell(net: Any) -> Any:
    """FullGraph(net, fused=False) + weighted BCE over (candidate, task) pairs, as a Cell."""
    from mindspore import nn, ops

    from mindspore_relaygr.model.network import FullGraph

    class RankingLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)  # keep the parameter names a checkpoint is loaded by
            self.graph = FullGraph(net, fused=False)  # the fused Custom ops have no gradient

        def construct(self, item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid, cand_ids, cand_pos,
                      cand_hi, cand_lo, labels, weights):
            logits = self.graph(item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid, cand_ids, cand_pos,
                                cand_hi, cand_lo)  # [M, tasks]
            # Stable BCE with logits: max(x, 0) - x * y + log(1 + exp(-|x|)).
            bce = ops.relu(logits) - logits * labels + ops.log1p(ops.exp(-ops.abs(logits)))
            return ops.reduce_sum(bce * weights)

    return RankingLoss()


EMBEDDING_TABLES = ("item_table", "action_table", "user_table")


def init_weights(net: Any, d_model: int, seed: int) -> None:
    """Re-initialize `net` at the scales of the HSTU reference code before training.

    HSTUNet's Normal(0.02) everywhere leaves the history -> candidate path ~1e-6 strong at step 0, so a
    model learns little beyond item popularity for thousands of steps. Here: embedding tables N(0, 0.02^2 d)
    (the reference scales its 0.02 embeddings by sqrt(d)), projections Xavier-normal, biases and LayerNorms
    as they are, the relative-bias table N(0, 0.02^2)."""
    from mindspore import Tensor

    rng = np.random.default_rng([seed, 7])
    for name, param in net.parameters_and_names():
        shape, leaf = tuple(param.shape), name.rsplit(".", 1)[-1]
        if leaf in EMBEDDING_TABLES:
            value = rng.normal(0.0, 0.02 * np.sqrt(d_model), shape)
        elif leaf.startswith("w_") and len(shape) == 3:  # per-head [h, d_in, d_out]
            value = rng.normal(0.0, np.sqrt(2.0 / (shape[1] + shape[2])), shape)
        elif leaf == "weight" and len(shape) == 2:  # nn.Dense [d_out, d_in]
            value = rng.normal(0.0, np.sqrt(2.0 / (shape[0] + shape[1])), shape)
        else:
            continue
        param.set_data(Tensor(value.astype(np.float32)))


@dataclass(frozen=True)
class Cut:
    """One training step: a user's history up to a cut point, the events right after it, sampled negatives."""

    user_id: int
    history: History  # events before the cut (the most recent max_history_len)
    positive_ids: np.ndarray  # int32 [p]: the next p events' items (p <= train.num_positives)
    high_rating: np.ndarray  # float32 [p]: second task's labels of the positives
    negative_ids: np.ndarray  # int32 [k], never in the user's training sequence

    @property
    def candidate_ids(self) -> np.ndarray:
        return np.concatenate([self.positive_ids, self.negative_ids]).astype(np.int32)


def iter_cuts(train: Mapping[int, History], num_items: int, rng: np.random.Generator, num_negatives: int,
              num_positives: int = 1, max_len: int | None = None, examples_per_user: int = 1) -> Iterator[Cut]:
    """One epoch of cuts: users in random order, each cut `examples_per_user` times at a random t in [1, n)
    (as `data.sequences.iter_training_examples`); positives are events t .. t + num_positives - 1."""
    for uid in rng.permutation(sorted(train)).tolist():
        seq = train[uid]
        if len(seq) <= 1:
            continue
        for t in rng.integers(1, len(seq), size=examples_per_user).tolist():
            hist = seq.slice(0, t) if max_len is None else cap_history(seq.slice(0, t), max_len)
            end = min(t + num_positives, len(seq))
            high = (seq.action_ids[t:end] >= HIGH_RATING_ACTION).astype(np.float32)
            yield Cut(uid, hist, seq.item_ids[t:end].astype(np.int32), high,
                      sample_negatives(rng, num_items, seq.item_ids, num_negatives))


def cut_targets(cut: Cut, num_tasks: int, bucket: int, high_rating_weight: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """(labels, weights), both float32 [bucket, num_tasks]; padded candidates weigh 0.

    Engage: the mean BCE over positives + the mean BCE over negatives. High rating: `high_rating_weight` x
    the mean BCE over positives (negatives were never rated)."""
    p, k = len(cut.positive_ids), len(cut.negative_ids)
    labels = np.zeros((bucket, num_tasks), np.float32)
    weights = np.zeros((bucket, num_tasks), np.float32)
    labels[:p, ENGAGE] = 1.0
    weights[:p, ENGAGE] = 1.0 / p
    weights[p:p + k, ENGAGE] = 1.0 / max(k, 1)
    if num_tasks > HIGH_RATING:
        labels[:p, HIGH_RATING] = cut.high_rating
        weights[:p, HIGH_RATING] = high_rating_weight / p
    return labels, weights


@dataclass
class TrainResult:
    """What a training run produced."""

    output_dir: Path
    checkpoint: Path  # the best checkpoint by validation NDCG@10
    best: dict[str, Any]  # epoch, step and validation metrics of the best checkpoint
    evals: list[dict[str, Any]] = field(default_factory=list)  # one entry per validation
    losses: list[float] = field(default_factory=list)  # per step
    seconds: float = 0.0


class Trainer:
    """Owns the model, the train graph and the optimizer; `fit()` runs `train.epochs` epochs."""

    def __init__(self, config: RelayGRConfig, data: PreparedData | None = None, model: Any = None,
                 progress: Progress | None = None) -> None:
        from mindspore import nn

        from mindspore_relaygr.model.ranker import RelayGRModel

        self.config, self.tc = config, config.train
        self.data = data if data is not None else prepare_data(config)
        cands = self.tc.num_positives + self.tc.num_negatives
        if cands > config.model.max_candidates:
            raise ConfigError(f"train.num_negatives={self.tc.num_negatives}: num_positives + num_negatives = {cands} "
                              f"exceeds the largest candidate bucket {config.model.max_candidates}")
        self.model = model if model is not None else RelayGRModel(config)
        if self.tc.init == "xavier":
            init_weights(self.model.net, config.model.d_model, config.model.seed)
        self.progress = progress or (lambda msg: logger.info("%s", msg))
        self.num_tasks = len(config.model.task_names)
        params = self.model.net.trainable_params()
        names = [p.name for p in params]
        self.optimizer = nn.Adam(params, learning_rate=self.tc.lr, weight_decay=self.tc.weight_decay)
        self.step_cell = nn.TrainOneStepCell(_loss_cell(self.model.net), self.optimizer)
        assert [p.name for p in params] == names, "wrapping the net renamed its parameters"
        self.step_cell.set_train(True)
        self.rng = np.random.default_rng(self.tc.seed)
        self.valid_set = self.data.eval_set("valid", self.tc.max_eval_users)

    def train_step(self, cut: Cut) -> float:
        """One optimizer step on one cut; returns its loss (before the update)."""
        from mindspore import Tensor

        inputs = full_inputs(self.config.model, cut.history, cut.candidate_ids)
        labels, weights = cut_targets(cut, self.num_tasks, len(inputs[8]), self.tc.high_rating_weight)
        loss = self.step_cell(*(Tensor(a) for a in (*inputs, labels, weights)))
        return float(loss.asnumpy())

    def validate(self) -> dict[str, float]:
        """HR@10 / NDCG@10 / MRR / AUC of the current weights on the validation set (via rank_full)."""
        from mindspore_relaygr.train.evaluate import evaluate_examples, score_full

        self.model.refresh_weights()  # the training steps changed the per-head weights
        return evaluate_examples(score_full(self.model, self.valid_set), len(self.valid_set))

    def epoch_cuts(self) -> list[Cut]:
        return list(iter_cuts(self.data.split.train, self.data.num_items, self.rng, self.tc.num_negatives,
                              self.tc.num_positives, self.data.max_history_len, self.tc.examples_per_user))

    def fit(self) -> TrainResult:
        """Train, validate every `eval_every` epochs, keep the best checkpoint; write config and metrics."""
        out = Path(self.tc.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        save_config(self.config, out / CONFIG_NAME)
        result = TrainResult(out, out / CHECKPOINT_NAME, {"valid_ndcg@10": -1.0})
        t0 = time.perf_counter()
        step, total = 0, None
        for epoch in range(1, self.tc.epochs + 1):
            cuts = self.epoch_cuts()
            total = total or len(cuts) * self.tc.epochs
            tick, window = time.perf_counter(), []
            for cut in cuts:
                loss = self.train_step(cut)
                result.losses.append(loss)
                window.append(loss)
                step += 1
                if step % self.tc.log_every == 0:
                    rate = len(window) / (time.perf_counter() - tick)
                    self.progress(f"epoch {epoch}/{self.tc.epochs} step {step}/{total} loss {np.mean(window):.4f} "
                                  f"{rate:.1f} steps/s eta {(total - step) / rate:.0f} s")
                    tick, window = time.perf_counter(), []
            if epoch % self.tc.eval_every == 0 or epoch == self.tc.epochs:
                self._validate(result, epoch, step, float(np.mean(result.losses[-len(cuts):])))
        result.seconds = time.perf_counter() - t0
        self.model.refresh_weights()
        self._write_metrics(result)
        return result

    def _validate(self, result: TrainResult, epoch: int, step: int, train_loss: float) -> None:
        t0 = time.perf_counter()
        metrics = {f"valid_{k}": v for k, v in self.validate().items()}
        entry = {"epoch": epoch, "step": step, "train_loss": train_loss, **metrics,
                 "eval_seconds": time.perf_counter() - t0}
        result.evals.append(entry)
        best = entry["valid_ndcg@10"] > result.best["valid_ndcg@10"]
        if best:
            result.best = entry
            self.model.save_checkpoint(result.checkpoint)
        self.progress(f"epoch {epoch} validation: HR@10 {entry['valid_hr@10']:.4f} NDCG@10 "
                      f"{entry['valid_ndcg@10']:.4f} (train loss {train_loss:.4f}, {entry['eval_seconds']:.1f} s)"
                      + (" -> saved best checkpoint" if best else ""))

    def _write_metrics(self, result: TrainResult) -> None:
        data = self.data
        report = {
            "best": result.best,
            "evals": result.evals,
            "checkpoint": result.checkpoint.name,
            "train_seconds": result.seconds,
            "steps": len(result.losses),
            "data": {"source": data.interactions.source, "users": data.interactions.num_users,
                     "items": data.num_items, "events": len(data.interactions),
                     "valid_users": len(self.valid_set), "max_history_len": data.max_history_len},
        }
        (result.output_dir / METRICS_NAME).write_text(json.dumps(report, indent=2) + "\n")


def train(config: RelayGRConfig, data: PreparedData | None = None, progress: Progress | None = None) -> TrainResult:
    """Train the ranker of `config` on `config.data` (or `data`); see the module docstring."""
    import mindspore as ms

    ms.set_seed(config.train.seed)
    return Trainer(config, data, progress=progress).fit()
