"""Training of the HSTU ranker: batched sequences, the generative-recommenders recipe plus ranking heads.

One step trains `train.batch_size` users' windows (the most recent `max_history_len` events of their training
sequences, padded to a length bucket) in one graph (`model.batch_forward.BatchForward`, reference ops):
- every history token predicts the next item: sampled softmax over the target and its own
  `train.num_negatives` uniform items (picked from `train.negative_pool` uniform items of the row), cosine /
  `model.score_temperature`, accidental hits masked (the reference recipe);
- the engage score the serving graphs return is that next-item prediction (cosine of the last token's state
  with the candidate's embedding), so every position trains it;
- `train.num_cuts` candidate tokens per row (M-FALCON): each is cut at a random event, holds that event's
  item and sees only the events before it; BCE on its high-rating label trains the high-rating head (weight
  `train.high_rating_weight`).
Dropout `model.dropout`, Adam (betas 0.9 / `train.beta2`; `train.weight_decay` is an L2 term). Every
`train.eval_every` epochs the ranker is validated with full ranking over all items (history filtered) through
the batched forward (equal to `rank_full`, tested); the best checkpoint by validation NDCG@10 is kept and
training stops after `train.patience` validations without improvement.
Each epoch ends with `last.ckpt` (weights + optimizer state) and `train_state.json`, from which
`resume=True` continues.

Output directory: `config.yaml` (resolved), `vocabulary.json` (what the model's ids mean: `relaygr eval` and
`export` check the data against it), `best.ckpt`, `last.ckpt`, `train_state.json`, `train_metrics.json`,
`train_curve.png` (loss and validation metrics per epoch); the last three are rewritten after every epoch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig, save_config
from mindspore_relaygr.data.sequences import cap_history
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.batches import FORWARD_FIELDS, TARGET_FIELDS, BatchShape, Shard, iter_batches, plan_batches
from mindspore_relaygr.train.dataset import PreparedData, prepare_data, save_vocabulary, sized_config
from mindspore_relaygr.train.full_ranking import BatchedScorer, metrics_of, ranking_cases
from mindspore_relaygr.train.lr_schedule import step_learning_rates
from mindspore_relaygr.train.prefetch import prefetched

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
CHECKPOINT_NAME = "best.ckpt"
LAST_NAME = "last.ckpt"


def epoch_checkpoint_name(epoch: int) -> str:
    """The model after `epoch` (train.keep_every): epoch_007.ckpt."""
    return f"epoch_{epoch:03d}.ckpt"
STATE_NAME = "train_state.json"
CONFIG_NAME = "config.yaml"
METRICS_NAME = "train_metrics.json"
PLOT_NAME = "train_curve.png"
SINGLE_PROCESS = Shard()


def _loss_cell(net: Any, config: RelayGRConfig, shape: BatchShape) -> Any:
    """The batched forward and the three losses of the module docstring, as one Cell."""
    from mindspore import dtype as mstype
    from mindspore import nn, ops

    from mindspore_relaygr.model.batch_forward import BatchForward
    from mindspore_relaygr.model.hstu import take
    from mindspore_relaygr.train.losses import sampled_softmax_loss

    tc, temperature = config.train, config.model.score_temperature
    groups, group_size = shape.num_cuts, shape.group_size

    class GRLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)  # keep the parameter names a checkpoint is loaded by
            self.forward = BatchForward(net, config.model.dropout)
            self.net = net

        def construct(self, item_ids, action_ids, pos, user_feats, user_row, valid, hist_idx, cand_idx, next_ids,
                      neg_ids, neg_weight, group_valid, high_rating, *noise):
            hidden = self.forward(item_ids, action_ids, pos, user_feats, user_row, valid, hist_idx, cand_idx, *noise)
            b, t, d = hidden.shape
            n = t - groups * group_size  # history tokens; the candidate tokens follow
            table = self.net.item_table
            targets = take(next_ids, 0, n, 1)
            loss = sampled_softmax_loss(take(hidden, 0, n, 1), ops.gather(table, targets, 0),
                                        ops.gather(table, neg_ids, 0), targets, neg_ids, temperature, neg_weight)
            if self.net.head is not None:  # the other tasks: a head on the candidate tokens (the positives)
                cand_hidden = ops.reshape(take(hidden, n, t, 1), (b, groups, group_size, d))
                count = ops.maximum(ops.reduce_sum(group_valid), 1.0)
                positives = ops.squeeze(take(cand_hidden, 0, 1, 2), 2)  # [B, G, d]
                x = take(self.net.head(positives), 0, 1, 2)[..., 0]  # high-rating logit [B, G]
                bce = ops.relu(x) - x * high_rating + ops.log1p(ops.exp(-ops.abs(x)))
                loss = loss + tc.high_rating_weight * ops.reduce_sum(bce * group_valid) / count
            return ops.cast(loss, mstype.float32)

    return GRLoss()


EMBEDDING_TABLES = ("item_table", "action_table", "user_table", "pos_table")
SCALED_TABLES = ("item_table", "action_table", "user_table")  # stored scaled by sqrt(d): see _param_groups


def init_weights(net: Any, d_model: int, seed: int, rab_mean: float = 0.0) -> None:
    """Re-initialize `net` at the scales of the HSTU reference code before training.

    Embedding tables N(0, 0.02^2 d) (the reference scales its 0.02 embeddings by sqrt(d)); the U/V/Q/K
    projection N(0, 0.02^2), so every layer starts close to the identity (its output is gated by a small U);
    the other projections Xavier-normal; the relative-bias table N(rab_mean, 0.02^2): with the reference's 0
    every attention weight SiLU(q.k + rab) starts near 0, with rab_mean = 1 near SiLU(1), so a layer starts
    as a causal mean over the history (as softmax attention does); biases and LayerNorms as HSTUNet made them."""
    from mindspore import Tensor

    rng = np.random.default_rng([seed, 7])
    for name, param in net.parameters_and_names():
        shape, leaf = tuple(param.shape), name.rsplit(".", 1)[-1]
        if leaf in EMBEDDING_TABLES:
            value = rng.normal(0.0, 0.02 * np.sqrt(d_model), shape)
        elif (leaf.startswith("w_") and len(shape) == 3) or name.endswith("w_u.weight"):  # W1: U, V, Q, K
            value = rng.normal(0.0, 0.02, shape)
        elif name == "rab.table":
            value = rng.normal(rab_mean, 0.02, shape)
        elif leaf == "weight" and len(shape) == 2:  # nn.Dense [d_out, d_in]
            value = rng.normal(0.0, np.sqrt(2.0 / (shape[0] + shape[1])), shape)
        else:
            continue
        param.set_data(Tensor(value.astype(np.float32)))


@dataclass
class TrainResult:
    """What a training run produced."""

    output_dir: Path
    checkpoint: Path  # the best checkpoint by validation NDCG@10
    best: dict[str, Any]  # epoch, step and validation metrics of the best checkpoint
    evals: list[dict[str, Any]] = field(default_factory=list)  # one entry per validation
    epoch_losses: list[float] = field(default_factory=list)
    step_losses: list[float] = field(default_factory=list)  # this worker's loss of every step
    steps: int = 0
    seconds: float = 0.0
    tokens: int = 0  # valid tokens through the training graph, every epoch of the run (resumes included)
    step_seconds: float = 0.0  # time in training steps of those epochs

    @property
    def tokens_per_s(self) -> float | None:
        """Valid tokens through the training graph per second of training steps (None: no epoch recorded one,
        as in a run resumed from a state written before `tokens` existed and then not trained further)."""
        return self.tokens / self.step_seconds if self.step_seconds > 0 else None


class Trainer:
    """Owns the model, the train graph and the optimizer; `fit()` runs up to `train.epochs` epochs."""

    def __init__(self, config: RelayGRConfig, data: PreparedData | None = None, model: Any = None,
                 progress: Progress | None = None, shard: Shard = SINGLE_PROCESS) -> None:
        from mindspore import nn

        from mindspore_relaygr.model.ranker import RelayGRModel

        self.data = data if data is not None else prepare_data(config)
        config = sized_config(config, self.data.interactions)  # null vocabulary sizes come from the data
        self.config, self.tc, self.shard = config, config.train, shard
        self.is_chief = shard.rank == 0  # the worker that writes files
        self.shape = BatchShape(self.tc.batch_size, self.tc.num_negatives, self.tc.num_cuts, self.tc.negative_pool,
                                tuple(self.tc.len_buckets) if self.tc.len_buckets else None)
        from mindspore_relaygr.train.losses import MIN_TEMPERATURE

        if config.model.score_temperature < MIN_TEMPERATURE:
            raise ConfigError(f"model.score_temperature={config.model.score_temperature}: training needs >= "
                              f"{MIN_TEMPERATURE} (the sampled softmax's exp(-2 / temperature) underflows below)")
        if self.tc.num_negatives > self.data.num_items:
            raise ConfigError(f"train.num_negatives={self.tc.num_negatives}: more than the {self.data.num_items} items")
        self.model = model if model is not None else RelayGRModel(config)
        if self.tc.init == "xavier":
            init_weights(self.model.net, config.model.d_model, config.model.seed, self.tc.rab_init)
        self.progress = progress or (lambda msg: logger.info("%s", msg))
        self.rng = np.random.default_rng(self.tc.seed)
        train_seqs = self.data.training_sequences(self.tc.train_on_valid)
        self.windows = {u: cap_history(s, self.data.max_history_len) for u, s in train_seqs.items()}
        # the count does not depend on the order
        self.steps_per_epoch = len(plan_batches(self.windows, config.model, self.tc.batch_size,
                                                np.random.default_rng(0), self.shape.len_buckets))
        self.optimizer = nn.Adam(self._param_groups(), learning_rate=self._learning_rates(1.0), beta1=0.9,
                                 beta2=self.tc.beta2, weight_decay=self.tc.weight_decay)
        self.loss_cell = _loss_cell(self.model.net, config, self.shape)
        self.step_cell = nn.TrainOneStepCell(self.loss_cell, self.optimizer)
        self.step_cell.set_train(True)
        self.valid_cases = ranking_cases(self.data.split.valid, self.data.max_history_len, self.tc.max_eval_users)
        self.scorer = BatchedScorer(self.model.net, config.model, self.data.num_items)

    def _param_groups(self) -> list[dict[str, Any]]:
        """Adam groups: the embedding tables (item, action, user) learn at lr * sqrt(d_model).

        The reference stores its embeddings at N(0, 0.02^2) and multiplies them by sqrt(d) in the forward
        pass; we store them already scaled (N(0, 0.02^2 d), `init_weights`), which is the same function, but
        Adam moves every coordinate by about lr whatever its scale, so the same update needs lr * sqrt(d).
        With one lr for everything the item table learns sqrt(50) ~ 7x slower than the reference's and the
        ranker stalls at popularity. nn.Adam, not nn.AdamWeightDecay: MindSpore's AdamWeightDecay has no bias
        correction; the reference's AdamW with weight decay 0 is Adam.
        """
        params = self.model.net.trainable_params()
        tables = [p for p in params if p.name.rsplit(".", 1)[-1] in SCALED_TABLES]
        rest = [p for p in params if p.name.rsplit(".", 1)[-1] not in SCALED_TABLES]
        scale = float(np.sqrt(self.config.model.d_model))
        return [{"params": tables, "lr": self._learning_rates(scale)}, {"params": rest}]

    def _learning_rates(self, scale: float) -> float | list[float]:
        """train.lr * scale at every step of `train.epochs` epochs, shaped by `train.lr_schedule`."""
        return step_learning_rates(self.tc.lr * scale, self.tc.lr_schedule, self.tc.epochs * self.steps_per_epoch)

    def train_step(self, batch: dict[str, np.ndarray], noise_rng: np.random.Generator) -> float:
        """One optimizer step on one batch, dropout masks drawn from `noise_rng`; returns the loss (before the
        update)."""
        from mindspore import Tensor

        from mindspore_relaygr.model.host_dropout import dropout_noise

        noise = dropout_noise(noise_rng, self.loss_cell.forward.noise_shapes(*batch["item_ids"].shape))
        loss = self.step_cell(*(Tensor(batch[k]) for k in (*FORWARD_FIELDS, *TARGET_FIELDS)),
                              *(Tensor(a) for a in noise))
        return float(loss.asnumpy())

    def validate(self) -> dict[str, float]:
        """Full-ranking HR/NDCG@{10,50,200} and MRR on the validation cases (all items, history filtered),
        through the batched forward (equal to `rank_full`, which `relaygr eval` uses)."""
        return metrics_of(self.scorer.ranks(self.valid_cases))

    def fit(self, resume: bool = False) -> TrainResult:
        """Train, validate every `eval_every` epochs, keep the best checkpoint, stop early; see the module."""
        out = Path(self.tc.output_dir)
        if self.is_chief:
            out.mkdir(parents=True, exist_ok=True)
            save_config(self.config, out / CONFIG_NAME)
            save_vocabulary(self.data.interactions, out)
        result = TrainResult(out, out / CHECKPOINT_NAME, {"valid_ndcg@10": -1.0})
        first_epoch = self._resume(result) if resume else 1
        if resume and self._patience_used(result):  # no validations (train_on_valid): never used up
            self.progress(f"the run stopped early after epoch {first_epoch - 1}: nothing to resume")
            first_epoch = self.tc.epochs + 1
        t0 = time.perf_counter() - result.seconds  # seconds: before a resume
        for epoch in range(first_epoch, self.tc.epochs + 1):
            tick = time.perf_counter()
            loss, epoch_tokens = self._epoch(epoch, result)
            result.step_seconds += time.perf_counter() - tick
            result.tokens += epoch_tokens
            result.epoch_losses.append(loss)
            stop = False
            if self.tc.train_on_valid:  # the validation targets trained: no model selection, the last epoch
                self._keep_last(result, epoch, loss)
            elif epoch % self.tc.eval_every == 0 or epoch == self.tc.epochs:
                stop = self._validate(result, epoch, loss)
            result.seconds = time.perf_counter() - t0
            self._save_state(result, epoch)
            if self.is_chief and self.tc.keep_every and epoch % self.tc.keep_every == 0:
                self.model.save_checkpoint(out / epoch_checkpoint_name(epoch))
            self._write_metrics(result)  # after every epoch: a stopped run's report and curve are current
            if stop:
                self.progress(f"early stop after epoch {epoch}: no better validation NDCG@10 in "
                              f"{self.tc.patience} validations")
                break
        if first_epoch > self.tc.epochs:  # resumed after the last or early-stopped epoch: the report as it stands
            self._write_metrics(result)
        self.model.refresh_weights()  # the serving graphs read assembled copies of the trained weights
        return result

    def _epoch(self, epoch: int, result: TrainResult) -> tuple[float, int]:
        """One pass over every user's window; prints a progress line every `log_every` steps."""
        batches = iter_batches(self.windows, self.config.model, self.shape, self.data.num_items, self.rng,
                               (self.tc.seed, epoch), self.shard)
        losses, tokens, tick = [], 0, time.perf_counter()
        for i, (_, _, batch) in enumerate(prefetched(batches), 1):
            # Dropout masks seeded per step (not a running generator): a resumed run draws the same ones.
            noise_rng = np.random.default_rng([self.tc.seed, epoch, i, self.shard.rank, 3])
            losses.append(self.train_step(batch, noise_rng))
            result.step_losses.append(losses[-1])
            tokens += int(batch["valid"].sum())
            result.steps += 1
            if i % self.tc.log_every == 0 or i == self.steps_per_epoch:
                elapsed = time.perf_counter() - tick
                bar = "#" * (20 * i // self.steps_per_epoch)
                self.progress(f"epoch {epoch}/{self.tc.epochs} [{bar:<20}] {i}/{self.steps_per_epoch} loss "
                              f"{np.mean(losses[-self.tc.log_every:]):.4f} {tokens / elapsed:,.0f} tokens/s "
                              f"eta {elapsed / i * (self.steps_per_epoch - i):.0f} s")
        return float(np.mean(losses)), tokens

    def _validate(self, result: TrainResult, epoch: int, train_loss: float) -> bool:
        """Validate, keep the best checkpoint; True when training should stop (patience used up)."""
        t0 = time.perf_counter()
        metrics = {f"valid_{k}": v for k, v in self.validate().items()}
        entry = {"epoch": epoch, "step": result.steps, "train_loss": train_loss, **metrics,
                 "eval_seconds": time.perf_counter() - t0}
        result.evals.append(entry)
        best = entry["valid_ndcg@10"] > result.best["valid_ndcg@10"]
        if best:
            result.best = entry
            if self.is_chief:
                self.model.save_checkpoint(result.checkpoint)
        self.progress(f"epoch {epoch} validation ({entry['valid_users']} users, all items): HR@10 "
                      f"{entry['valid_hr@10']:.4f} NDCG@10 {entry['valid_ndcg@10']:.4f} (train loss {train_loss:.4f}, "
                      f"{entry['eval_seconds']:.1f} s)" + (" -> saved best checkpoint" if best else ""))
        return self._patience_used(result)

    def _patience_used(self, result: TrainResult) -> bool:
        """`train.patience` validations since the best one: training stops (and a resume does not continue)."""
        return sum(1 for e in result.evals if e["epoch"] > result.best["epoch"]) >= self.tc.patience

    def _keep_last(self, result: TrainResult, epoch: int, train_loss: float) -> None:
        """train.train_on_valid: this epoch's weights are the checkpoint (no validation to choose by)."""
        result.best = {"epoch": epoch, "step": result.steps, "train_loss": train_loss}
        if self.is_chief:
            self.model.save_checkpoint(result.checkpoint)

    def _save_state(self, result: TrainResult, epoch: int) -> None:
        import mindspore as ms

        if not self.is_chief:
            return
        out = result.output_dir
        ms.save_checkpoint(self.step_cell, str(out / LAST_NAME))
        state = {"epoch": epoch, "steps": result.steps, "best": result.best, "evals": result.evals,
                 "epoch_losses": result.epoch_losses, "seconds": result.seconds, "tokens": result.tokens,
                 "step_seconds": result.step_seconds, "rng": self.rng.bit_generator.state}
        (out / STATE_NAME).write_text(json.dumps(state, indent=1) + "\n")

    def _resume(self, result: TrainResult) -> int:
        """Load last.ckpt and train_state.json from the output directory; returns the next epoch."""
        import mindspore as ms

        out = result.output_dir
        if not (out / STATE_NAME).is_file() or not (out / LAST_NAME).is_file():
            raise ConfigError(f"cannot resume: {out / STATE_NAME} or {out / LAST_NAME} is missing")
        state = json.loads((out / STATE_NAME).read_text())
        ms.load_param_into_net(self.step_cell, ms.load_checkpoint(str(out / LAST_NAME)))
        self.rng.bit_generator.state = state["rng"]
        result.best, result.evals = state["best"], state["evals"]
        result.epoch_losses, result.steps = state["epoch_losses"], state["steps"]
        result.seconds = float(state.get("seconds", 0.0))  # wall time of the epochs before the resume
        # A state written before these keys existed: the rate covers the epochs after the resume only.
        result.tokens, result.step_seconds = int(state.get("tokens", 0)), float(state.get("step_seconds", 0.0))
        self.progress(f"resumed from {out / LAST_NAME} after epoch {state['epoch']} (step {state['steps']})")
        return int(state["epoch"]) + 1

    def _write_metrics(self, result: TrainResult) -> None:
        data = self.data
        if self.shard.size > 1:  # every worker's own step losses (each is the mean over its part of a batch)
            path = result.output_dir / f"step_losses.rank{self.shard.rank}.json"
            path.write_text(json.dumps(result.step_losses) + "\n")
        if not self.is_chief:
            return
        report = {
            "best": result.best,
            "evals": result.evals,
            "epoch_losses": result.epoch_losses,
            "checkpoint": result.checkpoint.name,
            "train_seconds": result.seconds,
            "steps": result.steps,
            "workers": self.shard.size,
            "tokens_per_s": None if result.tokens_per_s is None else result.tokens_per_s * self.shard.size,
            "data": {"source": data.interactions.source, "users": data.interactions.num_users,
                     "items": data.num_items, "events": len(data.interactions),
                     "event_types": [str(t) for t in data.interactions.event_types],
                     "label": data.interactions.label_rule,
                     "user_features": dict(zip(data.interactions.user_feature_names,
                                               data.interactions.user_feature_sizes, strict=True)),
                     "valid_users": len(self.valid_cases), "max_history_len": data.max_history_len},
        }
        (result.output_dir / METRICS_NAME).write_text(json.dumps(report, indent=2) + "\n")
        from mindspore_relaygr.train.plots import plot_training

        plot_training(report, result.output_dir / PLOT_NAME)


def train(config: RelayGRConfig, data: PreparedData | None = None, progress: Progress | None = None,
          resume: bool = False, distributed: bool = False) -> TrainResult:
    """Train the ranker of `config` on `config.data` (or `data`); see the module docstring.

    distributed=True: one data-parallel worker of a job launched by `msrun` (scripts/run_distribute_train.sh):
    each worker builds its share of every global batch of `train.batch_size` rows, gradients are averaged
    across workers, every worker validates (the weights are the same) and worker 0 writes the outputs."""
    import mindspore as ms

    ms.set_seed(config.train.seed)
    shard = init_data_parallel(config) if distributed else Shard()
    return Trainer(config, data, progress=progress, shard=shard).fit(resume=resume)


def init_data_parallel(config: RelayGRConfig) -> Shard:
    """Join the collective-communication group that msrun set up; data-parallel mode with averaged gradients."""
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    from mindspore_relaygr.runtime import configure_context

    configure_context(config.context)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    return Shard(get_rank(), get_group_size())
