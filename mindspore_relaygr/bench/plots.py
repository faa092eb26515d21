"""PNG plots of the benchmarks (matplotlib, Agg backend)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

HIT_TIERS = ("device", "dram", "inflight", "partial", "miss")


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Lay the figure out, add a footer naming the machine it was measured on (`machine_caption`), save it."""
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.text(0.995, 0.005, machine_caption(_plot_machine()), ha="right", va="bottom", fontsize=7, color="0.35")
    fig.savefig(path, dpi=dpi)


def machine_caption(machine: dict[str, Any]) -> str:
    """"AMD EPYC, 2 cores, fp32 matmul 165 GFLOP/s, MindSpore 2.10.0, 2026-11-26 08:19 UTC" from `machine_info()`."""
    rate = max(machine["matmul_gflops"], default=None)
    matmul = f", fp32 matmul {rate:.0f} GFLOP/s" if rate else ""
    return (f"{machine['cpu_model']}, {machine['cores']} cores{matmul}, MindSpore {machine['mindspore']}, "
            f"{machine['date_utc']} UTC")


@functools.lru_cache(maxsize=1)
def _measured_machine() -> dict[str, Any]:
    from mindspore_relaygr.bench.machine import machine_info

    return machine_info(matmul_runs=1)  # once per process: a training run redraws its curve every epoch


def _plot_machine() -> dict[str, Any]:
    import datetime as dt

    return {**_measured_machine(), "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")}


def plot_slo_throughput(result: dict[str, Any], path: Path) -> None:
    """P99 ranking latency vs offered QPS for both modes, with the SLO line."""
    plt = pyplot()
    by_slo = bool(result.get("by_slo"))
    fig, axes = plt.subplots(1, 3 if by_slo else 2, figsize=(16 if by_slo else 11, 4))
    ax, bx = axes[0], axes[1]
    for mode, style in (("baseline", "o-"), ("relay", "s-")):
        _p99_with_interval(ax, result["points"], "qps", mode, style,
                           f"{mode} (compliant up to {result['compliant_qps'][mode]:g} QPS)")
    ax.axhline(result["slo_ms"], color="red", linestyle="--", label=f"SLO {result['slo_ms']:g} ms")
    ax.set(xlabel="offered load (QPS)", ylabel="rank P99 (ms), 95% bootstrap interval",
           title=f"SLO-compliant throughput: {_ratio_label(result)}")
    ax.legend(fontsize=8)
    relay = sorted((p for p in result["points"] if p["mode"] == "relay"), key=lambda p: p["qps"])
    bottom = [0.0] * len(relay)
    for tier in HIT_TIERS:
        share = [p["tiers"].get(tier, 0) / max(sum(p["tiers"].values()), 1) for p in relay]
        bx.bar([str(p["qps"]) for p in relay], share, bottom=bottom, label=tier)
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    bx.set(xlabel="offered load (QPS)", ylabel="share of ranks", title="relay: where ranks were served from")
    bx.legend(fontsize=8)
    if by_slo:
        _plot_by_slo(axes[2], result, "SLO-compliant QPS")
    save_figure(fig, path)
    plt.close(fig)


def matplotlib_ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def plot_model_bench(report: dict[str, Any], path: Path, target_share: float = 0.5) -> None:
    """`bench model`: median latency of each path vs prefix length, and each path's share of the matmul rate
    (near: the faster measurement right before / after it) with the target line."""
    plt = pyplot()
    rows = report["results"]
    batched = [r for r in rows if r["path"] in ("cached_batch", "prefill_batch")]
    fig, axes = plt.subplots(1, 3 if batched else 2, figsize=(18 if batched else 12, 4.2))
    ax, bx = axes[0], axes[1]
    if batched:
        _plot_per_user_by_batch(axes[2], rows)
    series: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        label = r["path"] if r["path"].startswith("prefill") else f"{r['path']} M={r['candidates']}"
        if r.get("batch", 1) > 1:
            label += f" B={r['batch']}"
        series.setdefault(label, []).append(r)
    for label, pts in sorted(series.items()):
        pts = sorted(pts, key=lambda r: r["prefix_len"])
        style = "k^-" if label == "prefill" else ("o-" if label.startswith("full") else "s--")
        lens = [r["prefix_len"] for r in pts]
        ax.plot(lens, [r["median_ms"] for r in pts], style, label=label)
        bx.plot(lens, [100 * r["near_share"] for r in pts], style, label=label)
    ax.set(xlabel="prefix length P (events)", ylabel="median latency (ms)", xscale="log", yscale="log",
           title="graph latency (rank_full, prefill, rank_cached)")
    bx.axhline(100 * target_share, color="red", linestyle="--", label=f"target {target_share:.0%} (at P=4096, M=128)")
    bx.set(xlabel="prefix length P (events)", ylabel="% of the machine's matmul GFLOP/s", xscale="log",
           title=f"share of the matmul rate (measured {min(report['matmul_gflops_all']):.0f}-"
                 f"{max(report['matmul_gflops_all']):.0f} GFLOP/s in the run)")
    lens = sorted({r["prefix_len"] for r in rows})
    for axis in (ax, bx):
        axis.xaxis.set_minor_locator(matplotlib_ticker().NullLocator())
        axis.set_xticks(lens)
        axis.set_xticklabels([str(p) for p in lens])
    ax.legend(fontsize=7, ncol=2)
    bx.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
    plt.close(fig)


def _plot_per_user_by_batch(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Median ms per user against users per call, one line per graph and prefix length (1 = the one-user call)."""
    single = {"cached_batch": "cached", "prefill_batch": "prefill_chunk"}
    for path, style in (("cached_batch", "s-"), ("prefill_batch", "^-")):
        for p in sorted({r["prefix_len"] for r in rows if r["path"] == path}):
            pts = [r for r in rows if r["prefix_len"] == p and (r["path"] == single[path] or r["path"] == path)]
            pts = sorted(pts, key=lambda r: r.get("batch", 1))
            if path == "cached_batch":  # one line per candidate count
                for m in sorted({r["candidates"] for r in pts}):
                    mine = [r for r in pts if r["candidates"] == m]
                    ax.plot([r.get("batch", 1) for r in mine], [r["median_ms"] / r.get("batch", 1) for r in mine],
                            style, label=f"cached rank P={p} M={m}")
            else:
                ax.plot([r.get("batch", 1) for r in pts], [r["median_ms"] / r.get("batch", 1) for r in pts], style,
                        label=f"prefill chunk of {pts[-1].get('chunk_len', 0)} at P={p}")
    batches = sorted({r.get("batch", 1) for r in rows})
    ax.set(xlabel="users per call", ylabel="median ms per user", xscale="log", ylim=(0, None),
           title="per-user time in batched calls (flat: no gain)")
    ax.xaxis.set_minor_locator(matplotlib_ticker().NullLocator())
    ax.set_xticks(batches)
    ax.set_xticklabels([str(b) for b in batches])
    ax.legend(fontsize=7)


def plot_max_seq(result: dict[str, Any], path: Path) -> None:
    """P99 vs history length for both modes (SLO line) and the longest compliant length."""
    plt = pyplot()
    by_slo = bool(result.get("by_slo"))
    fig, axes = plt.subplots(1, 3 if by_slo else 2, figsize=(16 if by_slo else 11, 4),
                             gridspec_kw={"width_ratios": [2, 1, 1.5] if by_slo else [2, 1]})
    ax, bx = axes[0], axes[1]
    for mode, style in (("baseline", "o-"), ("relay", "s-")):
        _p99_with_interval(ax, result["points"], "length", mode, style, mode)
    ax.axhline(result["slo_ms"], color="red", linestyle="--", label=f"SLO {result['slo_ms']:g} ms")
    ax.set(xlabel="history length (events)", ylabel="rank P99 (ms), 95% bootstrap interval", xscale="log",
           yscale="log", title=f"latency vs sequence length at {result['qps']:g} QPS")  # a collapsed point is 100x
    ax.legend(fontsize=8)
    modes = ["baseline", "relay"]
    bx.bar(modes, [result["max_len"][m] for m in modes], color=["tab:blue", "tab:orange"])
    bx.set(ylabel="longest compliant length", title=f"longest sequence: {_ratio_label(result)}")
    if by_slo:
        _plot_by_slo(axes[2], result, "longest compliant length (events)")
    save_figure(fig, path)
    plt.close(fig)


def _ratio_label(result: dict[str, Any]) -> str:
    from mindspore_relaygr.bench.headline import ratio_label

    return ratio_label(result["ratio"], result.get("ratio_range", [float("nan"), float("nan")]))


def _p99_with_interval(ax: Any, points: list[dict[str, Any]], axis: str, mode: str, style: str, label: str) -> None:
    """One mode's P99 against `axis` with its bootstrap interval as error bars."""
    pts = sorted((p for p in points if p["mode"] == mode), key=lambda p: p[axis])
    x, y = [p[axis] for p in pts], [p["p99_ms"] for p in pts]
    err = [[p["p99_ms"] - p["p99_low_ms"] for p in pts], [p["p99_high_ms"] - p["p99_ms"] for p in pts]]
    ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=label)


def _plot_by_slo(ax: Any, result: dict[str, Any], ylabel: str) -> None:
    """Each mode's best compliant value when the same points are judged at other budgets."""
    rows = result["by_slo"]
    for mode, style in (("baseline", "o-"), ("relay", "s-")):
        ax.plot([r["slo_ms"] for r in rows], [r[mode] for r in rows], style, label=mode)
    ax.axvline(result["slo_ms"], color="red", linestyle="--", label=f"run's SLO {result['slo_ms']:g} ms")
    ax.set(xlabel="P99 budget (ms)", ylabel=ylabel, title="same points, other budgets")
    ax.legend(fontsize=8)


def plot_ablation(rows: list[dict[str, Any]], slo_ms: float, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [r["variant"] for r in rows]
    ax.bar(names, [r["p99_ms"] for r in rows], color="tab:orange")
    ax.axhline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    for i, r in enumerate(rows):
        ax.text(i, r["p99_ms"], f"hit {r['hit_rate']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="rank P99 (ms)", title="relay with one mechanism disabled")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_cluster(report: dict[str, Any], path: Path) -> None:
    """`relaygr bench cluster`: rank P99 vs offered QPS per mode (SLO line) and cache hit rate per mode."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    styles = {"baseline": "o-", "relay": "s-", "relay_no_affinity": "^--"}
    for mode in report["modes"]:
        rows = sorted((r for r in report["results"] if r["mode"] == mode), key=lambda r: r["offered_qps"])
        qps = [r["offered_qps"] for r in rows]
        label = f"{mode} (compliant up to {report['compliant_qps'][mode]:g} QPS)"
        ax.plot(qps, [r["p99_ms"] for r in rows], styles.get(mode, "x-"), label=label)
        bx.plot(qps, [r["hit_rate"] for r in rows], styles.get(mode, "x-"), label=mode)
    ax.axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    ax.set(xlabel="offered load (QPS)", ylabel="rank P99 (ms)",
           title=f"HTTP cluster: {report['num_instances']} instances behind nginx")
    ax.legend(fontsize=8)
    bx.set(xlabel="offered load (QPS)", ylabel="share of ranks served from a cache", ylim=(-0.05, 1.05),
           title="cache hit rate (affinity vs random instance)")
    bx.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_retry(report: dict[str, Any], path: Path) -> None:
    """`relaygr bench retry`: goodput and refusals per connection count; P99 of the 200s and median 503 vs the SLO."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    rows = sorted(report["rows"], key=lambda r: r["connections"])
    conns = [r["connections"] for r in rows]
    ax.plot(conns, [r["goodput_rps"] for r in rows], "o-", label="goodput (200s per second)")
    ax.plot(conns, [r["refusals_per_s"] for r in rows], "s--", label="503s per second (resent at once)")
    ax.set(xscale="log", xlabel="connections", ylabel="per second", title="one instance, immediate retries")
    ax.legend(fontsize=8)
    nan = float("nan")
    p99 = [r["ok_p99_ms"] if r["ok_p99_ms"] is not None else nan for r in rows]
    bx.plot(conns, p99, "o-", label="P99 of the 200s")
    bx.plot(conns, [r["refusal_p50_ms"] if r["refusal_p50_ms"] is not None else nan for r in rows], "s--",
            label="median 503 latency")
    bx.axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    bx.set(xscale="log", xlabel="connections", ylabel="ms", title="latency")
    bx.legend(fontsize=8)
    for axis in (ax, bx):  # one plain tick per connection count, not the log scale's minor ones
        axis.minorticks_off()
        axis.set_xticks(conns, [str(c) for c in conns])
    save_figure(fig, path)
    plt.close(fig)


def plot_overload(report: dict[str, Any], path: Path) -> None:
    """`relaygr bench overload`: goodput and 503s vs offered load; accepted-rank P99 and 503 latency vs the SLO."""
    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    rows = sorted(report["single"], key=lambda r: r["multiple"])
    load = [r["multiple"] for r in rows]
    ax.plot(load, [r["goodput_rps"] for r in rows], "o-", label="goodput (200 within the SLO)")
    ax.plot(load, [r["rejected_503"] / r["ranks"] * r["offered_rps"] for r in rows], "s--", label="503 per second")
    ax.axhline(report["saturation"]["capacity_rps"], color="gray", linestyle=":", label="saturating throughput")
    ax.set(xlabel="offered load (x saturating throughput)", ylabel="ranks per second",
           title="one instance past its capacity")
    ax.legend(fontsize=8)
    p99 = [r["accepted_p99_ms"] for r in rows]
    bx.plot(load, p99, "o-", label="P99 of accepted ranks")
    bx.plot(load, [r["reject_p50_ms"] if r["reject_p50_ms"] is not None else float("nan") for r in rows], "s--",
            label="median 503 latency")
    bx.axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    top = max([report["slo_ms"], *(v for v in p99 if v is not None)])
    bx.set(xlabel="offered load (x saturating throughput)", ylabel="ms", title="latency", ylim=(0, 1.15 * top))
    bx.legend(fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_soak(report: dict[str, Any], path: Path) -> None:
    """`relaygr bench soak`: small panels vs minute (hit shares with the target, goodput, rank P99, pre-infer
    decisions, failures and 400s, orphan share, RSS per instance), the kill marked on each."""
    plt = pyplot()
    rows = report["per_minute"]
    minutes = [r["minute"] for r in rows]
    fig, axes = plt.subplots(3, 3, figsize=(15, 10))
    ax = axes.ravel()
    kill = report.get("kill") or {}
    bucket_min = report["bucket_s"] / 60.0

    def mark(a: Any, label: bool) -> None:
        """Shade the minutes from the kill to the instance's return; a dotted line at the kill."""
        for r in rows:
            if r["disrupted"]:
                a.axvspan(r["minute"] - 0.5, r["minute"] + 0.5, color="red", alpha=0.08, lw=0)
        if kill.get("at_s") is not None:  # bucket b is drawn at x = b, its start at b - 0.5
            a.axvline(kill["at_s"] / report["bucket_s"] - 0.5, color="red", linestyle=":",
                      label=f"kill of {kill['instance']} (shaded: until it is back)" if label else None)

    def share(key: str) -> list[float]:
        return [r[key]["share"] if r[key]["share"] is not None else float("nan") for r in rows]

    ax[0].plot(minutes, share("followed"), "o-", label="followed their pre-infer within the gap")
    ax[0].plot(minutes, share("with_preinfer"), "s--", label="every rank with a pre-infer")
    ax[0].axhline(report["target_share"], color="green", linestyle="--", label=f"target {report['target_share']:.0%}")
    ax[0].set(ylim=(-0.05, 1.05), ylabel="share served from a cache", title="cache hits of ranks with a pre-infer")
    ax[1].plot(minutes, [r["goodput_rps"] for r in rows], "o-")
    ax[1].set(ylabel="200 ranks / s", title="goodput")
    ax[2].plot(minutes, [r["p99_ms"] if r["p99_ms"] is not None else float("nan") for r in rows], "o-", label="P99")
    ax[2].plot(minutes, [r["p50_ms"] if r["p50_ms"] is not None else float("nan") for r in rows], "s--", label="P50")
    ax[2].axhline(report["slo_ms"], color="red", linestyle="--", label=f"SLO {report['slo_ms']:g} ms")
    ax[2].set(ylabel="ms (from the scheduled send)", title="rank latency")
    reasons = sorted({k for r in rows for k in r["preinfer_reasons"]})
    bottom = [0] * len(rows)
    for reason in reasons:
        vals = [r["preinfer_reasons"].get(reason, 0) for r in rows]
        ax[3].bar(minutes, vals, bottom=bottom, label=reason)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax[3].set(ylabel="pre-infers (202)", title="pre-infer decisions by reason")
    for kind in ("connection", "timeout", "5xx", "4xx", "other"):
        vals = [r["failed"].get(kind, 0) for r in rows]
        if any(vals):
            ax[4].plot(minutes, vals, "o-", label=f"failed: {kind}")
    for endpoint in ("preinfer", "rank"):
        ax[4].plot(minutes, [r["status_400"][endpoint] for r in rows], "x--", label=f"400 {endpoint}")
    ax[4].plot(minutes, [r["retries"] for r in rows], ".:", label="503 retries")
    ax[4].set(ylabel="requests", title="failures at the client, 400s, retries")
    ax[5].plot(minutes, [r["orphan_share"] if r["orphan_share"] is not None else float("nan") for r in rows], "o-")
    ax[5].set(ylim=(-0.05, 1.05), ylabel="orphan / pre-infers sent", title="orphan share of the pre-infers")
    for inst in sorted({s["instance"] for s in report["rss"] if s.get("rss_mb") is not None}):
        pts = [s for s in report["rss"] if s["instance"] == inst and s.get("rss_mb") is not None]
        ax[6].plot([s["t_s"] / report["bucket_s"] - 0.5 for s in pts], [s["rss_mb"] for s in pts], ".-",
                   markersize=3, label=inst)
    ax[6].set(ylabel="VmRSS (MB)", title="RSS per instance (worker)")
    answered = sorted({k for r in rows for k in r["answered_by"]})
    for inst in answered:
        ax[7].plot(minutes, [r["answered_by"].get(inst, 0) for r in rows], "o-", label=inst)
    ax[7].set(ylabel="answers", title="answers per instance")
    for inst in sorted({k for r in rows for k in r.get("cpu_cores", {})}):
        ax[8].plot(minutes, [r["cpu_cores"].get(inst, float("nan")) for r in rows], "o-", label=inst)
    ax[8].set(ylabel="cores (user + system CPU s per s)", title="CPU of the instances' workers and the client")
    for k, a in enumerate(ax):
        mark(a, label=k == 0)
        a.set_xlabel("minute" if bucket_min == 1 else f"minute (buckets of {report['bucket_s']:g} s)")
        if len(minutes) <= 20:
            a.set_xticks(minutes)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7)
    import textwrap

    fig.suptitle(textwrap.fill(f"bench soak: {report['instances']} instances, {report['rate']:g} users/s, "
                               f"{report['minutes']:g} min; {report['mix']['described']}", 160), fontsize=8)
    save_figure(fig, path)
    plt.close(fig)


def plot_batch_bench(report: dict[str, Any], path: Path) -> None:
    """`bench batching`: ranks per second of each run (one rank per device call vs batched), round by round; with
    a low-load phase, each run's P99 and its interval beside it."""
    plt = pyplot()
    low = report.get("low_load")
    fig, axes = plt.subplots(1, 2 if low else 1, figsize=(12 if low else 7, 4), squeeze=False)
    rounds = sorted({x["round"] for x in report["runs"]})
    ax = axes[0][0]
    for offset, size in ((-0.2, 1), (0.2, report["batch"])):
        runs = {x["round"]: x for x in report["runs"] if x["max_rank_batch"] == size}
        ax.bar([r + 1 + offset for r in rounds], [runs[r]["ranks_per_s"] for r in rounds], width=0.4,
               label=f"relay.max_rank_batch = {size}")
    ax.set(xlabel="round (the two runs of a round alternate their order)", ylabel="ranks per second",
           title=f"saturation, {report['clients']} closed-loop clients: {report['ratio_median']:.2f}x (median)")
    ax.set_xticks([r + 1 for r in rounds])
    ax.legend(loc="lower right")
    if low:
        ax = axes[0][1]
        for offset, size in ((-0.2, 1), (0.2, report["batch"])):
            runs = {x["round"]: x for x in low["runs"] if x["max_rank_batch"] == size}
            p99 = [runs[r]["p99_ms"] for r in rounds]
            err = [[runs[r]["p99_ms"] - runs[r]["p99_low_ms"] for r in rounds],
                   [runs[r]["p99_high_ms"] - runs[r]["p99_ms"] for r in rounds]]
            ax.bar([r + 1 + offset for r in rounds], p99, width=0.4, yerr=err, capsize=3,
                   label=f"relay.max_rank_batch = {size}")
        ax.set(xlabel="round", ylabel="P99 ms (95% bootstrap interval)",
               title=f"{low['qps']:g} QPS open loop: P99 batched / unbatched {low['p99_ratio']:.3f}x")
        ax.set_xticks([r + 1 for r in rounds])
        ax.legend(loc="lower right")
    fig.suptitle(f"{report['users']} users x {report['events']} events, {report['candidates']} candidates, "
                 f"ranks served from their device slots", fontsize=10)
    save_figure(fig, path)
    plt.close(fig)
