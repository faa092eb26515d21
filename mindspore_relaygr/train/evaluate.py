"""Leave-one-out evaluation of a checkpoint and the baselines, in two protocols on the same users.

- **full ranking** (the generative-recommenders protocol): the target among all items, the earlier items a
  fixed rule names removed from the ranking (`eval_filter`: by default the reference rule, the items of the
  200 most recent earlier events, and "every earlier item" next to it; never the model's history length);
  HR@10/50/200, NDCG@10/50/200, MRR, each with its standard error over the users;
- **sampled**: the target among `data.num_eval_negatives` negatives the user never rated (drawn from
  `data.eval_seed`, the same for every model); HR@10, NDCG@10, MRR, AUC.

Rows: ours through the full path (`rank_full`) and through the relay path (`prefill` all but the last
`suffix_len` events once, then `rank_cached` with them as the short-term suffix); both score every item as a
candidate (in chunks of the largest candidate bucket). R1 bounds their score difference by 1e-5, so the
metrics are identical unless an item sits within 2e-5 of a target's score (a near-tie that float
summation order may break either way); `path_agreement` checks that every rank difference is such a
near-tie and `relaygr eval` exits 1 otherwise. A candidate's
score does not depend on the other candidates (M-FALCON), so the sampled protocol reads the same scores.
Baselines: popularity (train-split counts) and SASRec trained on the same split with the same loss.
Ours are ranked by the engage logit (task 0).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.data.sequences import EvalExample, PopularityModel
from mindspore_relaygr.train.dataset import PreparedData, check_checkpoint, prepare_data, sized_config
from mindspore_relaygr.train.eval_filter import DEFAULT_FILTERS, HistoryFilter, check_filters
from mindspore_relaygr.train.full_ranking import (
    RankingCase,
    batch_ranks,
    full_path_logits,
    item_chunks,
    metrics_of,
    relay_path_logits,
)
from mindspore_relaygr.train.metrics import auc_from_scores, hit_rate_at_k, mrr, ndcg_at_k, rank_of_positive

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
K = 10
SAMPLED_METRICS = (f"hr@{K}", f"ndcg@{K}", "mrr", "auc")
R1_TOLERANCE = 1e-5  # the exactness invariant's bound on |full - relay| scores
FULL_METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")


def ranking_metrics(scores: np.ndarray) -> dict[str, float]:
    """Sampled protocol: scores [B, C] with the positive in column 0 -> HR@10, NDCG@10, MRR, AUC."""
    ranks = rank_of_positive(scores, 0)
    return {f"hr@{K}": hit_rate_at_k(ranks, K), f"ndcg@{K}": ndcg_at_k(ranks, K), "mrr": mrr(ranks),
            "auc": auc_from_scores(scores[:, 0], scores[:, 1:])}


def evaluate_examples(scores: np.ndarray, num_users: int) -> dict[str, float]:
    """`ranking_metrics` plus the number of users (a check that every example was scored)."""
    if scores.shape[0] != num_users:
        raise ValueError(f"{scores.shape[0]} score rows for {num_users} users")
    return {**ranking_metrics(scores), "users": num_users}


def cases_of(examples: Sequence[EvalExample]) -> list[RankingCase]:
    """The full-ranking cases of the sampled examples (same users, histories and targets)."""
    return [RankingCase(e.user_id, e.history, e.target_id, e.earlier_items) for e in examples]


def score_all_items(score: Callable[[Any], np.ndarray], examples: Sequence[EvalExample],
                    progress: Progress | None = None, every: int = 500) -> np.ndarray:
    """Scores [B, num_items + 1] of every item after every example's history."""
    rows = []
    for i, e in enumerate(examples, 1):
        rows.append(score(e.history))
        if progress and i % every == 0:
            progress(f"  {i}/{len(examples)} users")
    return np.stack(rows)


def protocol_rows(scores: np.ndarray, examples: Sequence[EvalExample],
                  filters: Sequence[HistoryFilter] = DEFAULT_FILTERS) -> dict[str, dict[str, Any]]:
    """Both protocols from all-item scores [B, num_items + 1]: "full" maps each filter's name to its metrics."""
    sampled = np.take_along_axis(scores, np.stack([e.candidate_ids for e in examples]), axis=1)
    cases = cases_of(examples)
    return {"full": {f.name: metrics_of(batch_ranks(scores, cases, f)) for f in filters},
            "sampled": evaluate_examples(sampled.astype(np.float64), len(examples))}


def run_evaluation(config: RelayGRConfig, checkpoint: str | Path, which: str = "test", suffix_len: int = 8,
                   baselines: Sequence[str] = ("popularity", "sasrec"), max_users: int | None = None,
                   data: PreparedData | None = None, progress: Progress | None = None,
                   sasrec_checkpoint: str | Path | None = None,
                   filters: Sequence[HistoryFilter] = DEFAULT_FILTERS) -> dict[str, Any]:
    """Evaluate the checkpoint (both paths) and the baselines; returns the report (see `format_table`).
    SASRec is trained in the run unless `sasrec_checkpoint` (written by `relaygr baseline`) is given. Full
    ranking is measured under every filter (the first is the one the progress lines and path check use)."""
    from mindspore_relaygr.model.ranker import RelayGRModel

    say = progress or (lambda msg: logger.info("%s", msg))
    filters = check_filters(list(filters))
    first = filters[0].name
    data = data if data is not None else prepare_data(config)
    config = sized_config(config, data.interactions)
    check_checkpoint(config, checkpoint, data.interactions)
    examples = data.eval_set(which, max_users)
    model = RelayGRModel(config)
    model.load_checkpoint(checkpoint)
    chunks = item_chunks(data.num_items, config.model.max_candidates)
    rows: dict[str, dict[str, Any]] = {}
    scores: dict[str, np.ndarray] = {}

    def timed(name: str, fn: Callable[[], np.ndarray]) -> None:
        say(f"{name}: scoring all {data.num_items} items for {len(examples)} users")
        t0 = time.perf_counter()
        scores[name] = fn()
        rows[name] = {**protocol_rows(scores[name], examples, filters), "seconds": time.perf_counter() - t0}
        full = rows[name]["full"][first]
        say(f"{name}: HR@10 {full['hr@10']:.4f} NDCG@10 {full['ndcg@10']:.4f} (all items, filter {first}); "
            f"sampled HR@10 {rows[name]['sampled']['hr@10']:.4f} ({rows[name]['seconds']:.0f} s)")

    full_name, relay_name = "ours (full path)", f"ours (relay path, suffix {suffix_len})"
    timed(full_name, lambda: score_all_items(lambda h: full_path_logits(model, h, chunks), examples, say))
    timed(relay_name, lambda: score_all_items(lambda h: relay_path_logits(model, h, chunks, suffix_len), examples,
                                              say))
    if "popularity" in baselines:
        popularity = PopularityModel().fit(data.training_sequences(config.train.train_on_valid))
        everything = np.arange(data.num_items + 1)
        timed("popularity", lambda: np.stack([popularity.score(everything) for _ in examples]))
    if "sasrec" in baselines:
        timed("SASRec", lambda: _sasrec_scores(config, data, examples, say, sasrec_checkpoint))
    identical = rows[full_name]["full"] == rows[relay_name]["full"] and \
        rows[full_name]["sampled"] == rows[relay_name]["sampled"]
    diff = np.abs(scores[full_name][:, 1:] - scores[relay_name][:, 1:])  # column 0 is padding (-inf)
    agreement = path_agreement(scores[full_name], scores[relay_name], examples, filters[0])
    return {"split": which, "filters": {f.name: f.rule for f in filters}, "tie_seed": config.data.tie_seed,
            "users": len(examples), "num_items": data.num_items,
            "num_negatives": data.num_eval_negatives, "suffix_len": suffix_len, "checkpoint": str(checkpoint),
            "model_version": config.model.version, "data_source": data.interactions.source,
            "max_history_len": data.max_history_len, "max_abs_diff_full_vs_relay": float(diff.max()),
            "identical_metrics": identical, **agreement, "rows": {k: {**v} for k, v in rows.items()}}


def path_agreement(full: np.ndarray, relay: np.ndarray, examples: Sequence[EvalExample],
                   history_filter: HistoryFilter = DEFAULT_FILTERS[0],
                   tolerance: float = R1_TOLERANCE) -> dict[str, Any]:
    """Do the relay path's all-item scores rank every target as the full path's do?

    R1 bounds the score difference by `tolerance`, not by 0, so an item scored within 2 x tolerance of the
    target on the full path may land on either side of it on the relay path (a near-tie; with thousands of
    items per user this happens). `paths_agree` holds when every score is within tolerance and every
    target's rank differs by at most the number of its near-ties."""
    cases = cases_of(examples)
    ranks_full, ranks_relay = batch_ranks(full, cases, history_filter), batch_ranks(relay, cases, history_filter)
    targets = np.array([e.target_id for e in examples])
    gap = np.abs(full - full[np.arange(len(examples)), targets][:, None])
    near = np.array([int(np.sum(np.delete(g[1:] <= 2 * tolerance, t - 1))) for g, t in zip(gap, targets, strict=True)])
    moved = np.abs(ranks_full - ranks_relay)
    within = bool(np.abs(full[:, 1:] - relay[:, 1:]).max() <= tolerance)
    return {"rank_differences": int(np.sum(moved > 0)), "rank_differences_unexplained": int(np.sum(moved > near)),
            "paths_agree": within and bool(np.all(moved <= near)), "r1_tolerance": tolerance}


def train_sasrec(config: RelayGRConfig, data: PreparedData, say: Progress,
                 after_validation: Callable[[Any, bool], None] | None = None) -> Any:
    """SASRec trained on the training split, its epoch chosen on validation NDCG@10 (all items, the same
    `train.max_eval_users` users as our ranker), stopped early with `train.patience` as our ranker; with
    `train.train_on_valid`, on the same events as our ranker for `train.sasrec_epochs` epochs, unvalidated."""
    from mindspore_relaygr.runtime import configure_context
    from mindspore_relaygr.train.baselines import SASRecTrainer

    configure_context(config.context)  # graph mode: without it MindSpore runs the step op by op (PyNative)
    sasrec = SASRecTrainer(config.train, data.num_items, seed=config.train.seed, progress=say,
                           temperature=config.model.score_temperature)
    if config.train.train_on_valid:
        return sasrec.fit(data.training_sequences(include_valid=True))
    valid = cases_of(data.eval_set("valid", config.train.max_eval_users))
    return sasrec.fit(data.split.train, valid=valid, eval_every=config.train.eval_every,
                      patience=config.train.patience, after_validation=after_validation)


def _sasrec_scores(config: RelayGRConfig, data: PreparedData, examples: Sequence[EvalExample],
                   say: Progress, checkpoint: str | Path | None = None) -> np.ndarray:
    """All-item scores of a SASRec trained now (`train_sasrec`), or loaded from `checkpoint`
    (`relaygr baseline`)."""
    from mindspore_relaygr.train.baselines import SASRecTrainer

    if checkpoint is None:
        sasrec = train_sasrec(config, data, say)
    else:
        say(f"SASRec: weights from {checkpoint}")
        sasrec = SASRecTrainer(config.train, data.num_items, seed=config.train.seed, progress=say,
                               temperature=config.model.score_temperature).load(checkpoint)
    return sasrec.score_all([e.history for e in examples])


def format_table(report: dict[str, Any]) -> str:
    """Plain-text tables of the report's rows, one per protocol."""
    lines = [f"{report['split']} split, {report['users']} users, histories of at most {report['max_history_len']} "
             f"events"]
    tables = [(lambda row, f=f: row["full"][f], FULL_METRICS,
               f"all {report['num_items']} items ranked, filter {f}: {rule}") for f, rule in report["filters"].items()]
    tables.append((lambda row: row["sampled"], SAMPLED_METRICS,
                   f"target + {report['num_negatives']} sampled negatives"))
    for pick, names, title in tables:
        head = f"{'model':<34}" + "".join(f"{m:>9}" for m in names)
        lines += ["", title, head, "-" * len(head)]
        for name, row in report["rows"].items():
            lines.append(f"{name:<34}" + "".join(f"{pick(row)[m]:>9.4f}" for m in names))
    se = next(iter(report["rows"].values()))["full"][next(iter(report["filters"]))]["se"]
    lines.append(f"standard errors over the {report['users']} users (first model, first filter): HR@10 "
                 f"{se['hr@10']:.4f}, NDCG@10 {se['ndcg@10']:.4f}")
    lines.append(f"max |full - relay| engage logit = {report['max_abs_diff_full_vs_relay']:.2e}; "
                 f"metrics identical: {report['identical_metrics']}; targets ranked differently: "
                 f"{report['rank_differences']} (all by near-ties within 2 x {report['r1_tolerance']:g}: "
                 f"{report['rank_differences_unexplained'] == 0}); paths agree: {report['paths_agree']}")
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    """The evaluation JSON, with the machine it ran on (measured now unless the report has it)."""
    from mindspore_relaygr.bench.machine import machine_info

    report.setdefault("machine", machine_info())
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
