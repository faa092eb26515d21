"""`relaygr bench cache`: DRAM spill/reload cost vs recomputing a prefix, and pool cost vs slot count.

Part 1, per prefix length P: `prefill` (recompute), `export_slot` (device -> DRAM spill) and
`import_slot` (DRAM -> device reload) of the same P-token prefix, and the bytes copied.
Part 2, per pool size (number of slots): write (`import_slot`), read (`export_slot`) and
`rank_cached` on the LAST slot of the pool, to show the cost does not grow with the pool.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.model.inputs import synthetic_history


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # compile / warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def copy_vs_recompute(config: RelayGRConfig, prefix_lens: list[int], repeats: int,
                      progress: Callable[[str], None]) -> list[dict[str, Any]]:
    from mindspore_relaygr.model import RelayGRModel

    model = RelayGRModel(replace(config, cache=replace(config.cache, num_slots=2)))
    user = 1 if config.model.user_feature_sizes else 0
    rows = []
    for p in prefix_lens:
        hist = synthetic_history(config.model, p - user)
        recompute = _median_ms(lambda hist=hist: model.prefill(0, hist), repeats)
        copy = model.export_slot(0)
        spill = _median_ms(lambda: model.export_slot(0), repeats)
        reload = _median_ms(lambda copy=copy: model.import_slot(1, copy), repeats)
        rows.append({"prefix_len": p, "bytes": copy.nbytes, "recompute_ms": recompute, "spill_ms": spill,
                     "reload_ms": reload, "reload_speedup": recompute / reload,
                     "copy_gb_per_s": copy.nbytes / (reload / 1e3) / 1e9})
        progress(f"P={p}: recompute {recompute:.1f} ms, spill {spill:.1f} ms, reload {reload:.1f} ms "
                 f"({recompute / reload:.1f}x cheaper), {copy.nbytes / 1e6:.1f} MB")
    return rows


def pool_cost_vs_slots(config: RelayGRConfig, slot_counts: list[int], prefix_len: int, suffix_len: int,
                       repeats: int, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    from mindspore_relaygr.model import RelayGRModel

    rows = []
    user = 1 if config.model.user_feature_sizes else 0
    hist = synthetic_history(config.model, prefix_len - user + suffix_len, seed=1)
    pre = {k: (v if k == "user_features" else v[: prefix_len - user]) for k, v in hist.items()}
    suf = {k: v[prefix_len - user:] for k, v in hist.items() if k != "user_features"}
    cands = np.arange(1, min(128, config.model.max_candidates) + 1)
    for slots in slot_counts:
        model = RelayGRModel(replace(config, cache=replace(config.cache, num_slots=slots)))
        last = slots - 1
        model.prefill(last, pre)
        copy = model.export_slot(last)
        write = _median_ms(lambda m=model, c=copy, s=last: m.import_slot(s, c), repeats)
        read = _median_ms(lambda m=model, s=last: m.export_slot(s), repeats)
        rank = _median_ms(lambda m=model, s=last: m.rank_cached(s, prefix_len - user, suf, cands), repeats)
        rows.append({"num_slots": slots, "pool_gb": model.layout.pool_bytes / 1e9, "write_ms": write,
                     "read_ms": read, "rank_cached_ms": rank})
        progress(f"{slots} slots ({model.layout.pool_bytes / 1e9:.2f} GB): write {write:.2f} ms, "
                 f"read {read:.2f} ms, rank_cached {rank:.1f} ms")
        del model, copy
        gc.collect()
    return rows


def format_tables(report: dict[str, Any]) -> str:
    lines = ["DRAM tier: reload vs recompute of the same prefix",
             f"{'P':>6} {'MB':>7} {'recompute ms':>13} {'spill ms':>9} {'reload ms':>10} {'reload cheaper':>15} "
             f"{'GB/s':>6}"]
    for r in report["copy"]:
        lines.append(f"{r['prefix_len']:>6} {r['bytes'] / 1e6:>7.1f} {r['recompute_ms']:>13.1f} {r['spill_ms']:>9.2f} "
                     f"{r['reload_ms']:>10.2f} {r['reload_speedup']:>14.1f}x {r['copy_gb_per_s']:>6.2f}")
    base = report["pool"][0] if report["pool"] else None
    lines += ["", f"Device pool cost vs number of slots (P={report['pool_prefix_len']}, last slot of the pool)",
              f"{'slots':>6} {'pool GB':>8} {'write ms':>9} {'read ms':>8} {'rank_cached ms':>15} {'vs first':>9}"]
    for r in report["pool"]:
        ratio = max(r["write_ms"] / base["write_ms"], r["read_ms"] / base["read_ms"],
                    r["rank_cached_ms"] / base["rank_cached_ms"])
        lines.append(f"{r['num_slots']:>6} {r['pool_gb']:>8.2f} {r['write_ms']:>9.2f} {r['read_ms']:>8.2f} "
                     f"{r['rank_cached_ms']:>15.1f} {ratio:>8.2f}x")
    return "\n".join(lines)
