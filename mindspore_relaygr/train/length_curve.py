"""Ranking quality vs the longest history the ranker sees: `relaygr lengths`.

For every length L the same recipe (the given config) is trained with `model.max_seq_len = L + 1` (the user
token and L events), length buckets up to it, and its best checkpoint is ranked on the test split against all
items (the history is the L most recent events before the target; the filtered items follow fixed rules,
`eval_filter`, the same at every L, so a longer model is not credited with filtering more). The ranking is the
batched full-path forward of `relaygr caps` at the model's own length, which equals `rank_full` (its tests
check) and takes seconds where ranking user by user takes minutes; `relaygr eval` checks the relay path of a
checkpoint. Each length's run lives in `OUTPUT_DIR/len_<L>/`; a length whose test report (`test_metrics.json`)
exists is not run again, and one whose training was interrupted resumes from its last epoch, so a stopped sweep
continues where it stopped. The sweep writes `length_curve.json` (one row per length) and `length_curve.png`
(HR@10 and NDCG@10 vs L). Given a `relaygr caps` report (`context`), the figure draws it in a second panel under
the same filter: training length on the left, the served context of one model on the right.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mindspore_relaygr.bench.plots import pyplot, save_figure
from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.eval_filter import DEFAULT_FILTERS

BASE_BUCKETS = (64, 128, 256, 512, 1024, 2048)
CURVE_JSON, CURVE_PLOT, EVAL_NAME = "length_curve.json", "length_curve.png", "test_metrics.json"
METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")


def length_overrides(max_len: int, output_dir: Path) -> list[str]:
    """Config overrides of one point: the model takes up to `max_len` events, written to `output_dir`."""
    if max_len < 1:
        raise ValueError(f"history length must be >= 1, got {max_len}")
    tokens = max_len + 1  # the user token
    buckets = [b for b in BASE_BUCKETS if b < tokens] + [tokens]
    return [f"model.max_seq_len={tokens}", f"model.len_buckets={buckets}", f"cache.max_prefix_len={tokens}",
            "train.max_history_len=null", f"train.output_dir={output_dir}"]


def load_context(path: str | Path) -> dict[str, Any]:
    """A `relaygr caps` report to draw next to the curve; ConfigError unless it is one measured under the
    curve's filter (the first of `DEFAULT_FILTERS`, the filter of every length's evaluation)."""
    path = Path(path)
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"context report {path}: {exc}") from None
    if not isinstance(report, dict) or not {"rows", "filters", "model_max_history"} <= report.keys() \
            or not all(isinstance(r, dict) and "cap" in r for r in report["rows"]) or not report["rows"]:
        raise ConfigError(f"context report {path}: not a `relaygr caps` report (rows of caps, filters)")
    curve_filter = DEFAULT_FILTERS[0].name
    if curve_filter not in report["filters"]:
        raise ConfigError(f"context report {path} has filters {list(report['filters'])}; the length curve is "
                          f"evaluated under {curve_filter}: rerun `relaygr caps --filter {curve_filter}`")
    return report


def curve_row(max_len: int, report: dict[str, Any], train_metrics: dict[str, Any]) -> dict[str, Any]:
    """One row of the curve from a length's test report (`quality_vs_cap` at the model's own length): the
    metrics under the report's first filter with their standard errors, every filter's metrics under
    "by_filter", and how the point was trained."""
    (row,) = report["rows"]
    by_filter = row["metrics"]
    first = next(iter(report["filters"]))
    full = by_filter[first]
    return {"max_len": max_len, "filter": first, **{m: full[m] for m in METRICS}, "se": full["se"],
            "users": full["users"], "by_filter": by_filter,
            "best_epoch": train_metrics["best"]["epoch"], "epochs_run": len(train_metrics["epoch_losses"]),
            "train_seconds": train_metrics["train_seconds"], "tokens_per_s": train_metrics["tokens_per_s"]}


def run_length_curve(config_path: str | Path, lengths: Sequence[int], output_dir: str | Path,
                     overrides: Sequence[str] = (), max_users: int | None = None,
                     progress: Callable[[str], None] = print,
                     context: str | Path | None = None) -> list[dict[str, Any]]:
    """Train and evaluate every length (skipping finished ones); write and return the curve rows. `context`:
    a `relaygr caps` report drawn next to the curve (checked before any training)."""
    from mindspore_relaygr.bench.model_bench import write_report
    from mindspore_relaygr.train.cap_curve import quality_vs_cap
    from mindspore_relaygr.train.trainer import CHECKPOINT_NAME, LAST_NAME, METRICS_NAME, STATE_NAME, train

    context_report = load_context(context) if context is not None else None
    out = Path(output_dir)
    rows = []
    for max_len in sorted(set(lengths)):
        run_dir = out / f"len_{max_len}"
        cfg = load_config(config_path, [*overrides, *length_overrides(max_len, run_dir)])
        if not (run_dir / EVAL_NAME).is_file():
            resume = (run_dir / STATE_NAME).is_file() and (run_dir / LAST_NAME).is_file()
            progress(f"length {max_len}: {'resuming' if resume else 'training'} in {run_dir}")
            train(cfg, progress=progress, resume=resume)  # a finished or early-stopped run trains no further
            report = quality_vs_cap(cfg, run_dir / CHECKPOINT_NAME, ["all"], "test", max_users, progress,
                                    DEFAULT_FILTERS)
            write_report(report, run_dir / EVAL_NAME)
        report = json.loads((run_dir / EVAL_NAME).read_text())
        rows.append(curve_row(max_len, report, json.loads((run_dir / METRICS_NAME).read_text())))
        progress(f"length {max_len}: test HR@10 {rows[-1]['hr@10']:.4f} NDCG@10 {rows[-1]['ndcg@10']:.4f}")
    from mindspore_relaygr.bench.machine import machine_info

    (out / CURVE_JSON).write_text(json.dumps({"config": str(config_path), "overrides": list(overrides),
                                              "context": None if context is None else str(context),
                                              "rows": rows, "machine": machine_info()}, indent=2) + "\n")
    plot_length_curve(rows, out / CURVE_PLOT, context_report)
    return rows


def format_curve(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of the curve (the first filter's metrics; standard errors under it)."""
    head = f"{'max len':>8} " + " ".join(f"{m:>9}" for m in METRICS) + f" {'epochs':>7} {'train s':>8}"
    lines = [f"filter {rows[0]['filter']}" if rows else "", head]
    for r in rows:
        lines.append(f"{r['max_len']:>8} " + " ".join(f"{r[m]:>9.4f}" for m in METRICS)
                     + f" {r['epochs_run']:>7} {r['train_seconds']:>8.0f}")
    if rows:
        se = rows[-1]["se"]
        lines.append(f"standard error of one point: HR@10 {se['hr@10']:.4f}, NDCG@10 {se['ndcg@10']:.4f}")
    return "\n".join(lines)


def plot_length_curve(rows: Sequence[dict[str, Any]], path: str | Path,
                      context: dict[str, Any] | None = None) -> None:
    """HR@10 and NDCG@10 vs the longest history (log x axis), +- 2 standard errors. With `context` (a `relaygr
    caps` report) a second panel beside it, on the same y scale: that one model's metrics vs its input cap
    under the curve's filter."""
    from mindspore_relaygr.train.cap_curve import metrics_by_cap

    plt = pyplot()
    panels = 1 if context is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), sharey=True, squeeze=False)
    ax = axes[0][0]
    name = rows[0]["filter"] if rows else DEFAULT_FILTERS[0].name
    users = rows[0]["users"] if rows else 0
    series = [(ax, [(r["max_len"], r) for r in rows], "longest history trained and served (events)",
               f"one model per length ({users} users, all items)")]
    if context is not None:
        by_cap = metrics_by_cap(context, name)
        series.append((axes[0][1], sorted(by_cap.items()), "serving cap (most recent events)",
                       f"one model trained on up to {context['model_max_history']} events, input capped"))
    for axis, points, xlabel, title in series:
        xs = [x for x, _ in points]
        for key, style in (("hr@10", "o-"), ("ndcg@10", "s-")):
            axis.errorbar(xs, [m[key] for _, m in points], yerr=[2 * m["se"][key] for _, m in points], fmt=style,
                          capsize=3, label=key.upper())
        axis.set_xscale("log")
        axis.minorticks_off()
        axis.set_xticks(xs, [str(x) for x in xs])
        axis.set(xlabel=xlabel, title=f"{title}\nfilter {name}; bars +- 2 SE")
        axis.title.set_fontsize(9)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    ax.set_ylabel("test metric (full ranking)")
    save_figure(fig, path, dpi=110)
    plt.close(fig)
