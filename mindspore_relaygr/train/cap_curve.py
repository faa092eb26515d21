"""Ranking quality of one trained model vs the serving cap on its history: `relaygr caps`.

A served ranker sees at most the cap's most recent events of a user's history (the baseline's
`relay.max_online_len`, or the longest history a P99 budget affords). For every cap the test (or
validation) split is ranked with full ranking over all items, each history cut to its `cap` most
recent events and those events' items filtered, through the batched forward that validation uses
(equal to `rank_full`, which tests check). The model is trained once; only its input shrinks, which
is what a tighter serving budget does to a deployed model (`relaygr lengths` instead trains one
model per length).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.errors import ConfigError

METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")


def check_caps(caps: Sequence[int], longest: int) -> list[int]:
    """Sorted distinct caps, each within 1..longest (the model's history length)."""
    bad = [c for c in caps if not 1 <= c <= longest]
    if bad or not caps:
        raise ConfigError(f"caps {list(caps)}: each must be in 1..{longest} (the model's longest history)")
    return sorted(set(caps))


def quality_vs_cap(config: RelayGRConfig, checkpoint: str | Path, caps: Sequence[int], split: str = "test",
                   max_users: int | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """One row of full-ranking metrics per cap, the same checkpoint throughout."""
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import check_checkpoint, prepare_data
    from mindspore_relaygr.train.full_ranking import BatchedScorer, metrics_of, ranking_cases

    data = prepare_data(config)
    config = data.config
    check_checkpoint(config, checkpoint)
    caps = check_caps(caps, data.max_history_len)
    if split not in ("test", "valid"):
        raise ConfigError(f"split {split!r}: expected 'test' or 'valid'")
    if split == "valid" and config.train.train_on_valid:
        raise ConfigError("split 'valid': this model trained on the validation events (train.train_on_valid)")
    model = RelayGRModel(config)
    model.load_checkpoint(str(checkpoint))
    scorer = BatchedScorer(model.net, config.model, data.num_items)
    targets = data.split.test if split == "test" else data.split.valid
    rows = []
    for cap in caps:
        t0 = time.perf_counter()
        cases = ranking_cases(targets, cap, max_users)
        metrics = metrics_of(scorer.ranks(cases))
        rows.append({"cap": cap, **{m: metrics[m] for m in METRICS}, "users": metrics["users"],
                     "capped_users": sum(1 for c in cases if len(targets[c.user_id].history) > cap),
                     "seconds": time.perf_counter() - t0})
        progress(f"cap {cap}: HR@10 {metrics['hr@10']:.4f} NDCG@10 {metrics['ndcg@10']:.4f} "
                 f"({rows[-1]['capped_users']} of {metrics['users']} histories cut, {rows[-1]['seconds']:.0f} s)")
    return {"checkpoint": str(checkpoint), "split": split, "model_max_history": data.max_history_len, "rows": rows}


def format_caps(report: dict[str, Any]) -> str:
    head = f"{'cap':>6} " + " ".join(f"{m:>9}" for m in METRICS) + f" {'cut':>6}"
    lines = [f"{report['split']} split, {report['rows'][0]['users']} users, model trained on up to "
             f"{report['model_max_history']} events: full ranking with each history cut to the cap", head]
    lines += [f"{r['cap']:>6} " + " ".join(f"{r[m]:>9.4f}" for m in METRICS) + f" {r['capped_users']:>6}"
              for r in report["rows"]]
    return "\n".join(lines)


def plot_caps(report: dict[str, Any], path: str | Path) -> None:
    """HR@10 and NDCG@10 vs the cap (log x)."""
    from mindspore_relaygr.bench.plots import pyplot, save_figure

    plt = pyplot()
    rows = report["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    caps = [r["cap"] for r in rows]
    for metric, style in (("hr@10", "o-"), ("ndcg@10", "s-")):
        ax.plot(caps, [r[metric] for r in rows], style, label=metric.upper())
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(caps, [str(c) for c in caps])
    ax.set_xlabel("serving cap (most recent events)")
    ax.set_ylabel("test metric (full ranking)" if report["split"] == "test" else "validation metric")
    ax.set_title(f"one model (trained on up to {report['model_max_history']} events) vs its input cap")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def write_caps(report: dict[str, Any], out: str | Path) -> None:
    """JSON (with the machine) and the PNG next to it."""
    from mindspore_relaygr.bench.model_bench import write_report

    out = Path(out)
    write_report(report, out)
    plot_caps(report, out.with_suffix(".png"))
