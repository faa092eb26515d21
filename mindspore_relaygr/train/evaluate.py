"""Leave-one-out evaluation: the target among `data.num_eval_negatives` sampled negatives, per user.

Rows of the table (same users, same candidates):
- ours, full path: `rank_full(history, candidates)`;
- ours, relay path: `prefill` the first n - s events into a pool slot, then `rank_cached` with the last
  s events as the short-term suffix (R1 says both give the same scores, so the same metrics);
- popularity (train-split counts) and a SASRec-style transformer trained on the same split.
Ours are ranked by p(engage) (task 0).
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
from mindspore_relaygr.train.dataset import PreparedData, prepare_data
from mindspore_relaygr.train.metrics import auc_from_scores, hit_rate_at_k, mrr, ndcg_at_k, rank_of_positive

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
K = 10
METRIC_NAMES = (f"hr@{K}", f"ndcg@{K}", "mrr", "auc")
ENGAGE = 0


def ranking_metrics(scores: np.ndarray) -> dict[str, float]:
    """scores [B, C] with the positive in column 0 -> HR@10, NDCG@10, MRR, AUC."""
    ranks = rank_of_positive(scores, 0)
    return {f"hr@{K}": hit_rate_at_k(ranks, K), f"ndcg@{K}": ndcg_at_k(ranks, K), "mrr": mrr(ranks),
            "auc": auc_from_scores(scores[:, 0], scores[:, 1:])}


def evaluate_examples(scores: np.ndarray, num_users: int) -> dict[str, float]:
    """`ranking_metrics` plus the number of users (a check that every example was scored)."""
    if scores.shape[0] != num_users:
        raise ValueError(f"{scores.shape[0]} score rows for {num_users} users")
    return {**ranking_metrics(scores), "users": num_users}


def score_full(model: Any, examples: Sequence[EvalExample]) -> np.ndarray:
    """p(engage) [B, C] of every example's candidates through `rank_full`."""
    return np.stack([model.rank_full(e.history, e.candidate_ids)[:, ENGAGE] for e in examples])


def relay_split(num_events: int, suffix_len: int) -> int:
    """Events kept in the prefix: all but the last `suffix_len`, at least one."""
    return max(1, num_events - suffix_len)


def score_relay(model: Any, examples: Sequence[EvalExample], suffix_len: int, slot: int = 0) -> np.ndarray:
    """p(engage) [B, C] through the relay path: prefill events [0, n - s) into `slot`, rank_cached the rest."""
    rows = []
    for e in examples:
        k = relay_split(len(e.history), suffix_len)
        model.prefill(slot, e.history.slice(0, k))
        rows.append(model.rank_cached(slot, k, e.history.slice(k), e.candidate_ids)[:, ENGAGE])
        model.release_slot(slot)
    return np.stack(rows)


def score_popularity(popularity: PopularityModel, examples: Sequence[EvalExample]) -> np.ndarray:
    return np.stack([popularity.score(e.candidate_ids) for e in examples])


def run_evaluation(config: RelayGRConfig, checkpoint: str | Path, which: str = "test", suffix_len: int = 8,
                   baselines: bool = True, max_users: int | None = None, data: PreparedData | None = None,
                   progress: Progress | None = None) -> dict[str, Any]:
    """Evaluate the checkpoint (both paths) and the baselines; returns the report (see `format_table`)."""
    from mindspore_relaygr.model.ranker import RelayGRModel

    say = progress or (lambda msg: logger.info("%s", msg))
    data = data if data is not None else prepare_data(config)
    examples = data.eval_set(which, max_users)
    model = RelayGRModel(config)
    model.load_checkpoint(checkpoint)
    rows: dict[str, dict[str, float]] = {}

    def timed(name: str, fn: Callable[[], np.ndarray]) -> np.ndarray:
        t0 = time.perf_counter()
        scores = fn()
        rows[name] = {**evaluate_examples(scores, len(examples)), "seconds": time.perf_counter() - t0}
        say(f"{name}: " + ", ".join(f"{m} {rows[name][m]:.4f}" for m in METRIC_NAMES)
            + f" ({rows[name]['seconds']:.1f} s)")
        return scores

    say(f"evaluating {len(examples)} users ({which} split, {data.num_eval_negatives} negatives each)")
    full_name, relay_name = "ours (full path)", f"ours (relay path, suffix {suffix_len})"
    full = timed(full_name, lambda: score_full(model, examples))
    relay = timed(relay_name, lambda: score_relay(model, examples, suffix_len))
    if baselines:
        popularity = PopularityModel().fit(data.split.train)
        timed("popularity", lambda: score_popularity(popularity, examples))
        timed("SASRec-style", lambda: _sasrec_scores(config, data, examples, say))
    identical = all(rows[full_name][m] == rows[relay_name][m] for m in METRIC_NAMES)
    return {"split": which, "users": len(examples), "num_negatives": data.num_eval_negatives,
            "suffix_len": suffix_len, "checkpoint": str(checkpoint), "model_version": config.model.version,
            "data_source": data.interactions.source, "max_abs_diff_full_vs_relay": float(np.abs(full - relay).max()),
            "identical_metrics": identical, "rows": rows}


def _sasrec_scores(config: RelayGRConfig, data: PreparedData, examples: Sequence[EvalExample],
                   say: Progress) -> np.ndarray:
    from mindspore_relaygr.train.baselines import SASRecTrainer

    sasrec = SASRecTrainer(config.train, data.num_items, seed=config.train.seed, progress=say)
    sasrec.fit(data.split.train)
    return sasrec.score(examples)


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table of the report's rows."""
    head = f"{'model':<34}" + "".join(f"{m:>9}" for m in (*METRIC_NAMES, "seconds"))
    lines = [f"{report['split']} split: {report['users']} users, target + {report['num_negatives']} sampled "
             f"negatives", head, "-" * len(head)]
    for name, row in report["rows"].items():
        lines.append(f"{name:<34}" + "".join(f"{row[m]:>9.4f}" for m in METRIC_NAMES) + f"{row['seconds']:>9.1f}")
    lines.append(f"max |full - relay| p(engage) = {report['max_abs_diff_full_vs_relay']:.2e}; "
                 f"metrics identical: {report['identical_metrics']}")
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2) + "\n")
