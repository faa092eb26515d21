"""Training curve plot: loss per epoch and validation HR@10 / NDCG@10 (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mindspore_relaygr.bench.plots import pyplot, save_figure


def plot_training(report: dict[str, Any], path: str | Path) -> None:
    """Two panels from a `train_metrics.json` report: training loss per epoch, validation metrics per epoch."""
    plt = pyplot()

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    losses = report["epoch_losses"]
    ax.plot(range(1, len(losses) + 1), losses, "o-", markersize=3)
    ax.set(xlabel="epoch", ylabel="training loss", title="training loss")
    evals = report["evals"]
    epochs = [e["epoch"] for e in evals]
    for key, style in (("valid_hr@10", "o-"), ("valid_ndcg@10", "s-")):
        bx.plot(epochs, [e[key] for e in evals], style, markersize=3, label=key.removeprefix("valid_"))
    if evals:
        bx.set(xlabel="epoch", ylabel="metric", title=f"validation, all items ranked ({evals[0]['valid_users']} users)")
        bx.legend()
    else:
        bx.set_axis_off()
        bx.text(0.5, 0.5, "no validation: the validation events trained (train.train_on_valid)",
                ha="center", va="center", transform=bx.transAxes)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
