"""How much the order of equal timestamps moves the metrics: `relaygr ties`.

Leave-one-out takes each user's last event as the test target and the one before as the validation target,
so the order of events in the same second decides both. On ML-1M 42% of users have their last event in the
same second as the one before; the generative-recommenders reference sorts with an unstable sort, so its
order among ties is neither the file's nor ours. For the file order and every `data.tie_seed` given, this
re-splits the same event log and measures full ranking on the test split for:

- popularity, refitted on that order's training events: free of any leak, the tie order's whole effect;
- the checkpoint, trained on the file order's split: under another order some users' new test target is
  an event it trained on (counted as `targets_trained_on`), so its spread is indicative, not an unbiased
  estimate (an unbiased one retrains per order).

Each order's row holds the metrics under every filter; the summary gives mean, sample standard deviation,
minimum and maximum over the seeds (the file order is listed, not included).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.train.eval_filter import DEFAULT_FILTERS, HistoryFilter, check_filters

SUMMARY_METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "mrr")
MODELS = ("ours", "popularity")


def _target_events(split: Any) -> dict[int, tuple[int, int]]:
    return {uid: (t.item_id, t.timestamp) for uid, t in split.test.items()}


def summarize(rows: Sequence[dict[str, Any]], filters: Sequence[str]) -> dict[str, Any]:
    """model -> filter -> metric -> {mean, sd, min, max} over `rows` (sd: sample, 0 for one row)."""
    out: dict[str, Any] = {}
    for model in MODELS:
        out[model] = {}
        for name in filters:
            out[model][name] = {}
            for metric in SUMMARY_METRICS:
                values = np.array([r[model][name][metric] for r in rows])
                out[model][name][metric] = {"mean": float(values.mean()),
                                            "sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                                            "min": float(values.min()), "max": float(values.max())}
    return out


def tie_order_spread(config: RelayGRConfig, checkpoint: str | Path, seeds: Sequence[int],
                     filters: Sequence[HistoryFilter] = DEFAULT_FILTERS, max_users: int | None = None,
                     progress: Callable[[str], None] = print) -> dict[str, Any]:
    """One row per tie order (the file's, then every seed) and the summary over the seeds; see the module."""
    from mindspore_relaygr.data.events import load_interactions
    from mindspore_relaygr.data.sequences import PopularityModel
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import check_checkpoint, prepare_data
    from mindspore_relaygr.train.full_ranking import BatchedScorer, batch_ranks, metrics_of, ranking_cases

    filters = check_filters(list(filters))
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)}: give at least one, each once")
    interactions = load_interactions(config.data)
    base = prepare_data(replace(config, data=replace(config.data, tie_seed=None)), interactions)
    config = base.config
    check_checkpoint(config, checkpoint, interactions)
    model = RelayGRModel(config)
    model.load_checkpoint(str(checkpoint))
    scorer = BatchedScorer(model.net, config.model, base.num_items)
    file_targets = _target_events(base.split)
    trained = base.training_sequences(config.train.train_on_valid)
    rows = []
    for seed in [None, *seeds]:
        t0 = time.perf_counter()
        data = base if seed is None else prepare_data(replace(config, data=replace(config.data, tie_seed=seed)),
                                                      interactions)
        cases = ranking_cases(data.split.test, data.max_history_len, max_users)
        targets = _target_events(data.split)
        changed = [c.user_id for c in cases if targets[c.user_id] != file_targets[c.user_id]]
        # A changed target is an event of the file order's history: trained on when that history was.
        trained_on = sum(1 for u in changed if u in trained and np.any(
            (trained[u].item_ids == targets[u][0]) & (trained[u].timestamps == targets[u][1])))
        ours = {name: metrics_of(r) for name, r in scorer.ranks_by_filter(cases, filters).items()}
        popularity = PopularityModel().fit(data.training_sequences(config.train.train_on_valid))
        scores = np.tile(popularity.score(np.arange(data.num_items + 1)), (len(cases), 1))
        scores[:, 0] = -np.inf
        popular = {f.name: metrics_of(batch_ranks(scores, cases, f)) for f in filters}
        rows.append({"tie_seed": seed, "users": len(cases), "targets_changed": len(changed),
                     "targets_trained_on": trained_on, "ours": ours, "popularity": popular,
                     "seconds": time.perf_counter() - t0})
        first = filters[0].name
        progress(f"tie order {'file' if seed is None else f'seed {seed}'}: {len(changed)} of {len(cases)} test "
                 f"targets differ from the file order's; HR@10 ours {ours[first]['hr@10']:.4f}, popularity "
                 f"{popular[first]['hr@10']:.4f} (filter {first}, {rows[-1]['seconds']:.0f} s)")
    names = [f.name for f in filters]
    return {"checkpoint": str(checkpoint), "split": "test", "data_source": base.interactions.source,
            "model_max_history": base.max_history_len, "train_on_valid": config.train.train_on_valid,
            "filters": {f.name: f.rule for f in filters}, "seeds": list(seeds), "rows": rows,
            "summary": summarize(rows[1:], names)}


def format_ties(report: dict[str, Any]) -> str:
    """Per order: changed targets and HR@10 / NDCG@10 of both models; then mean +- sd over the seeds."""
    lines = []
    for name, rule in report["filters"].items():
        lines += [f"filter {name}: {rule}",
                  f"{'tie order':>10} {'changed':>8} {'trained':>8} {'ours HR@10':>11} {'NDCG@10':>8} "
                  f"{'pop HR@10':>10} {'NDCG@10':>8}"]
        for r in report["rows"]:
            order = "file" if r["tie_seed"] is None else f"seed {r['tie_seed']}"
            o, p = r["ours"][name], r["popularity"][name]
            lines.append(f"{order:>10} {r['targets_changed']:>8} {r['targets_trained_on']:>8} {o['hr@10']:>11.4f} "
                         f"{o['ndcg@10']:>8.4f} {p['hr@10']:>10.4f} {p['ndcg@10']:>8.4f}")
        s = report["summary"]
        for model in MODELS:
            hr, ndcg = s[model][name]["hr@10"], s[model][name]["ndcg@10"]
            lines.append(f"{model} over {len(report['seeds'])} seeds: HR@10 {hr['mean']:.4f} +- {hr['sd']:.4f} "
                         f"[{hr['min']:.4f}, {hr['max']:.4f}], NDCG@10 {ndcg['mean']:.4f} +- {ndcg['sd']:.4f}")
        lines.append("")
    lines.append("changed: test targets that differ from the file order's; trained: of those, events the checkpoint "
                 "trained on (its rows are indicative only; popularity is refitted per order)")
    return "\n".join(lines)
