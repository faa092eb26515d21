"""Ranking quality of one trained model vs the serving cap on its history: `relaygr caps`.

A served ranker sees at most the cap's most recent events of a user's history (the baseline's
`relay.max_online_len`, or the longest history a P99 budget affords). For every cap the test (or
validation) split is ranked with full ranking over all items, each history cut to its `cap` most
recent events, through the batched forward that validation uses (equal to `rank_full`, which tests
check). The earlier items removed from the ranking follow fixed rules (`eval_filter`) that do not
depend on the cap: a cap changes what the model reads, never what the evaluation filters. The model
is trained once; only its input shrinks, which is what a tighter serving budget does to a deployed
model (`relaygr lengths` instead trains one model per length). Every row holds each metric's
standard error and, from the second cap on, the paired change from every smaller cap with its
standard error (the same users ranked twice, so a change is measured far more precisely than
either metric).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.eval_filter import DEFAULT_FILTERS, HistoryFilter, check_filters

METRICS = ("hr@10", "ndcg@10", "hr@50", "ndcg@50", "hr@200", "ndcg@200", "mrr")
PAIRED = ("hr@10", "ndcg@10")  # metrics whose change between caps is reported with its paired error


def check_caps(caps: Sequence[int], longest: int) -> list[int]:
    """Sorted distinct caps, each within 1..longest (the model's history length)."""
    bad = [c for c in caps if not 1 <= c <= longest]
    if bad or not caps:
        raise ConfigError(f"caps {list(caps)}: each must be in 1..{longest} (the model's longest history)")
    return sorted(set(caps))


def quality_vs_cap(config: RelayGRConfig, checkpoint: str | Path, caps: Sequence[int | str], split: str = "test",
                   max_users: int | None = None, progress: Callable[[str], None] = print,
                   filters: Sequence[HistoryFilter] = DEFAULT_FILTERS) -> dict[str, Any]:
    """One row of full-ranking metrics per cap ("all": the model's longest history), under every filter, the
    same checkpoint throughout."""
    from mindspore_relaygr.model.ranker import RelayGRModel
    from mindspore_relaygr.train.dataset import check_checkpoint, prepare_data
    from mindspore_relaygr.train.full_ranking import BatchedScorer, metrics_of, ranking_cases
    from mindspore_relaygr.train.metrics import paired_difference

    data = prepare_data(config)
    config = data.config
    check_checkpoint(config, checkpoint, data.interactions)
    filters = check_filters(list(filters))
    caps = check_caps([data.max_history_len if c == "all" else int(c) for c in caps], data.max_history_len)
    if split not in ("test", "valid"):
        raise ConfigError(f"split {split!r}: expected 'test' or 'valid'")
    if split == "valid" and config.train.train_on_valid:
        raise ConfigError("split 'valid': this model trained on the validation events (train.train_on_valid)")
    model = RelayGRModel(config)
    model.load_checkpoint(str(checkpoint))
    scorer = BatchedScorer(model.net, config.model, data.num_items)
    targets = data.split.test if split == "test" else data.split.valid
    rows: list[dict[str, Any]] = []
    smaller: dict[int, dict[str, Any]] = {}  # cap -> filter name -> ranks
    first = filters[0].name
    for cap in caps:
        t0 = time.perf_counter()
        cases = ranking_cases(targets, cap, max_users)
        ranks = scorer.ranks_by_filter(cases, filters)
        row: dict[str, Any] = {"cap": cap, "users": len(cases),
                               "capped_users": sum(1 for c in cases if len(targets[c.user_id].history) > cap),
                               "metrics": {name: metrics_of(r) for name, r in ranks.items()}}
        row["change_from"] = {  # smaller cap -> filter -> metric -> this cap's value minus that cap's, paired
            str(c): {name: {m: dict(zip(("diff", "se"), paired_difference(before[name], r, m), strict=True))
                            for m in PAIRED} for name, r in ranks.items()} for c, before in smaller.items()}
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        smaller[cap] = ranks
        m = row["metrics"][first]
        progress(f"cap {cap}: HR@10 {m['hr@10']:.4f} NDCG@10 {m['ndcg@10']:.4f} (filter {first}; "
                 f"{row['capped_users']} of {row['users']} histories cut, {row['seconds']:.0f} s)")
    return {"checkpoint": str(checkpoint), "split": split, "model_max_history": data.max_history_len,
            "filters": {f.name: f.rule for f in filters}, "tie_seed": config.data.tie_seed, "rows": rows}


def paired_change(report: dict[str, Any], low: int, high: int, metric: str = "ndcg@10",
                  filter_name: str | None = None) -> dict[str, float] | None:
    """{"diff", "se"}: `metric` at cap `high` minus at cap `low` over the same users (None when equal caps);
    KeyError for a pair the report did not measure."""
    if low == high:
        return None
    if low > high:
        change = paired_change(report, high, low, metric, filter_name)
        return {"diff": -change["diff"], "se": change["se"]}
    name = filter_name or next(iter(report["filters"]))
    row = next(r for r in report["rows"] if r["cap"] == high)
    return row["change_from"][str(low)][name][metric]


def metrics_by_cap(report: dict[str, Any], filter_name: str | None = None) -> dict[int, dict[str, Any]]:
    """cap -> full-ranking metrics under `filter_name` (default: the report's first filter)."""
    name = filter_name or next(iter(report["filters"]))
    if name not in report["filters"]:
        raise KeyError(f"filter {name!r} is not in the report (it has {list(report['filters'])})")
    return {r["cap"]: r["metrics"][name] for r in report["rows"]}


def format_caps(report: dict[str, Any]) -> str:
    """One plain-text table per filter: the metrics at every cap, the paired change of NDCG@10 from the
    previous cap (+- its paired standard error), and how many histories the cap cut."""
    rows = report["rows"]
    lines = [f"{report['split']} split, {rows[0]['users']} users, model trained on up to "
             f"{report['model_max_history']} events: full ranking with each history cut to the cap"]
    for name, rule in report["filters"].items():
        head = f"{'cap':>6} " + " ".join(f"{m:>9}" for m in METRICS) + f" {'dNDCG@10 +- se':>18} {'cut':>6}"
        lines += ["", f"filter {name}: {rule}", head]
        for i, r in enumerate(rows):
            change = paired_change(report, rows[i - 1]["cap"], r["cap"], "ndcg@10", name) if i else None
            delta = f"{change['diff']:+.4f} +- {change['se']:.4f}" if change else "-"
            lines.append(f"{r['cap']:>6} " + " ".join(f"{r['metrics'][name][m]:>9.4f}" for m in METRICS)
                         + f" {delta:>18} {r['capped_users']:>6}")
        se = rows[-1]["metrics"][name]["se"]
        lines.append(f"standard error of one point: HR@10 {se['hr@10']:.4f}, NDCG@10 {se['ndcg@10']:.4f}")
    return "\n".join(lines)


def plot_caps(report: dict[str, Any], path: str | Path) -> None:
    """Left: HR@10 and NDCG@10 vs the cap under every filter (+- 2 standard errors of each point). Right: the
    change from the smallest cap under the first filter, paired over the same users (+- 2 standard errors of
    the change): what a longer input buys, measured far more precisely than the points on the left."""
    from mindspore_relaygr.bench.plots import pyplot, save_figure

    plt = pyplot()
    rows = report["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    caps = [r["cap"] for r in rows]
    for i, name in enumerate(report["filters"]):
        for metric, marker in (("hr@10", "o"), ("ndcg@10", "s")):
            values = [r["metrics"][name][metric] for r in rows]
            errors = [2 * r["metrics"][name]["se"][metric] for r in rows]
            ax.errorbar(caps, values, yerr=errors, fmt=marker + ("-" if i == 0 else "--"), capsize=3,
                        label=f"{metric.upper()}, filter {name}")
    first = next(iter(report["filters"]))
    for metric, marker in (("hr@10", "o-"), ("ndcg@10", "s-")):
        changes = [paired_change(report, caps[0], c, metric, first) for c in caps]
        diffs = [0.0 if c is None else c["diff"] for c in changes]
        errors = [0.0 if c is None else 2 * c["se"] for c in changes]
        bx.errorbar(caps, diffs, yerr=errors, fmt=marker, capsize=3, label=metric.upper())
    bx.axhline(0.0, color="grey", linewidth=0.8)
    for axis in (ax, bx):
        axis.set_xscale("log")
        axis.minorticks_off()
        axis.set_xticks(caps, [str(c) for c in caps])
        axis.set_xlabel("serving cap (most recent events)")
        axis.grid(alpha=0.3)
    ax.set_ylabel("test metric (full ranking)" if report["split"] == "test" else "validation metric")
    ax.set_title(f"one model (trained on up to {report['model_max_history']} events) vs its input cap\n"
                 "(bars: +- 2 standard errors of each point)", fontsize=10)
    ax.legend(fontsize=7, loc="center right")
    bx.set_ylabel(f"change from cap {caps[0]} (filter {first})")
    bx.set_title("what a longer input buys: the same users, paired\n(bars: +- 2 standard errors of the change)",
                 fontsize=10)
    bx.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def write_caps(report: dict[str, Any], out: str | Path) -> None:
    """JSON (with the machine) and the PNG next to it."""
    from mindspore_relaygr.bench.model_bench import write_report

    out = Path(out)
    write_report(report, out)
    plot_caps(report, out.with_suffix(".png"))
