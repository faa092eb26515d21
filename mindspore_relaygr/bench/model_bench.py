"""`relaygr bench model`: latency, achieved GFLOP/s and memory of the full / prefill / cached paths.

For each prefix length P and candidate count M: `rank_full` over P events, `prefill` of the first
P - S events and `rank_cached` of the last S events (S = --suffix) + M candidates, after warm-up,
median and p99 over repeats. FLOPs are the multiply-adds the model needs for its output (see
`count_flops`); the machine's matmul GFLOP/s is measured in the same run for comparison: before the
sweep and after every path's timing, so each path has a measurement right before and right after it.
Each path's share is given against the faster of those two ("near": the machine as it was while the
path ran; its rate drifts by up to ~25% within a run on shared VMs) and against the fastest
measurement of the whole run (the strictest reading).

On the fused_cpu backend (model/backend.py), a few more calls of each path run under the kernel profile
(`KernelProfile`): the tile GEMMs' own GFLOP/s (the rate the path would reach if nothing but its GEMMs
took time) and their share of the model FLOPs, and how the threads' time over those calls splits into
the GEMMs, the fused elementwise work around them (bias + SiLU, layer norm), the rest of the kernels'
loops (bias index, masks) and everything outside the kernels (MindSpore's own ops, the framework, idle
threads). That tells a path held back by its GEMM shapes (small tiles, K = d_qk) from one held back by
everything around them, and which part of the rest.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import ModelConfig, RelayGRConfig
from mindspore_relaygr.model.inputs import synthetic_history

logger = logging.getLogger(__name__)


def count_flops(cfg: ModelConfig, kind: str, tokens: int, candidates: int = 0, past: int = 0) -> float:
    """Model FLOPs (2 per multiply-add) of one call.

    kind "full": `tokens` behaviour tokens + candidates; "prefill": `tokens` new tokens after `past`
    cached ones; "cached": `tokens` suffix tokens after `past` cached ones + candidates. The last
    layer's token rows only need K and V (their outputs feed nothing), as the graphs compute them.
    """
    d, h, dqk, dv, layers = cfg.d_model, cfg.num_heads, cfg.d_qk, cfg.d_v, cfg.num_layers
    proj_kv = 2 * d * h * (dqk + dv)
    proj_all = proj_kv + 2 * d * h * (dqk + dv) + 2 * h * dv * d  # + Q, U, output projection
    pair = 2 * h * (dqk + dv)
    causal_pairs = tokens * past + tokens * (tokens + 1) / 2
    token_flops = (layers - 1) * (tokens * proj_all + causal_pairs * pair) + tokens * proj_kv
    if kind == "prefill":
        return float(token_flops)
    cand_keys = past + tokens + 1  # every behaviour token and itself
    cand_flops = layers * candidates * (proj_all + cand_keys * pair) + candidates * 2 * d * len(cfg.task_names)
    return float(token_flops + cand_flops)


def measure_matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """fp32 GFLOP/s of a size x size MindSpore matmul on this machine, right now."""
    import mindspore as ms
    from mindspore import ops

    a = ms.Tensor(np.random.default_rng(0).standard_normal((size, size)).astype(np.float32))
    ops.matmul(a, a).asnumpy()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ops.matmul(a, a).asnumpy()
        times.append(time.perf_counter() - t0)
    return 2 * size**3 / float(np.median(times)) / 1e9


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class PathResult:
    path: str  # full | prefill | cached | cached_batch | prefill_chunk | prefill_batch
    prefix_len: int
    candidates: int
    suffix_len: int
    median_ms: float
    p99_ms: float
    first_call_s: float  # compile + first run
    memory_mb: float  # RSS growth at the first call of this graph shape (its compiled memory)
    gflops: float  # model FLOPs / median time
    matmul_gflops_near: float  # the faster of the matmul measurements right before and right after this path
    # From `PROFILE_CALLS` more calls under the kernel profile (None on the plain backend):
    gemm_gflops: float | None = None  # the tile GEMMs' own rate on all kernel threads
    gemm_flops_share: float | None = None  # tile GEMM FLOPs / model FLOPs (over 1: padded or masked tile work)
    # Of the kernel threads' time over those calls (wall time x threads), the part ...
    gemm_time_share: float | None = None  # inside the tile GEMMs
    elementwise_time_share: float | None = None  # in the fused elementwise work (bias + SiLU, layer norm, ...)
    kernel_time_share: float | None = None  # anywhere in the kernels' parallel loops (includes both above)
    batch: int = 1  # users per call (cached_batch, prefill_batch: one batched call for this many users)
    chunk_len: int = 0  # prefill_chunk, prefill_batch: events computed per user, after prefix_len - chunk_len cached


PROFILE_CALLS = 5


def _time(fn, repeats: int) -> tuple[float, float, float, float]:
    """(first call seconds, RSS growth MB at it, median ms, p99 ms)."""
    rss0, t0 = _rss_mb(), time.perf_counter()
    fn()
    first, grown = time.perf_counter() - t0, _rss_mb() - rss0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return first, grown, float(np.median(times)), float(np.percentile(times, 99))


def _kernel_profile(fn, flops: float, profile) -> dict[str, float]:
    """Run `fn` PROFILE_CALLS times under the kernel profile; the PathResult profile fields."""
    profile.start()
    t0 = time.perf_counter()
    for _ in range(PROFILE_CALLS):
        fn()
    wall_s = time.perf_counter() - t0
    c = profile.read()
    thread_s = wall_s * c.threads
    return {"gemm_gflops": c.gemm_gflops, "gemm_flops_share": c.gemm_flops / (flops * PROFILE_CALLS),
            "gemm_time_share": c.gemm_s / thread_s, "elementwise_time_share": c.elementwise_s / thread_s,
            "kernel_time_share": c.kernel_s / thread_s}


def run_model_bench(config: RelayGRConfig, prefix_lens: list[int], candidates: list[int], suffix_len: int,
                    repeats: int, progress=print, batches: list[int] = ()) -> dict[str, Any]:
    """Run the sweep; returns a JSON-able dict with the machine matmul rate and every result row.

    `batches`: also time the cached path for that many users per call (`rank_cached_batch`, each user its own
    slot of the same length), next to the single-user call, and the last prefill chunk
    (`trigger.prefill_chunk_len` events after the rest of the prefix) of that many users in one `prefill_batch`
    call, next to one user's chunk alone; the config needs that many slots."""
    from mindspore_relaygr.model import RelayGRModel

    model = RelayGRModel(config)
    cfg = config.model
    profile = None
    if model.backend.name == "fused_cpu":
        from mindspore_relaygr.model.kernels import KernelProfile

        profile = KernelProfile()
    user = 1 if cfg.user_feature_sizes else 0
    probes = [measure_matmul_gflops()]
    progress(f"matmul 2048^2 fp32: {probes[0]:.1f} GFLOP/s; backend: {model.backend.name}")
    rng = np.random.default_rng(0)
    rows: list[PathResult] = []

    def timed(path: str, p: int, m: int, suffix: int, fn, flops: float, batch: int = 1,
              chunk_len: int = 0) -> PathResult:
        first, mem, med, p99 = _time(fn, repeats)
        probes.append(measure_matmul_gflops())
        kernel_split = _kernel_profile(fn, flops, profile) if profile is not None else {}
        row = PathResult(path, p, m, suffix, med, p99, first, mem, flops / med / 1e6, max(probes[-2], probes[-1]),
                         **kernel_split, batch=batch, chunk_len=chunk_len)
        rows.append(row)
        return row

    for p in prefix_lens:
        hist = synthetic_history(cfg, p - user, seed=p)
        pre = {k: (v if k == "user_features" else v[: p - user - suffix_len]) for k, v in hist.items()}
        suf = {k: v[p - user - suffix_len:] for k, v in hist.items() if k != "user_features"}
        n_pre = p - user - suffix_len
        row = timed("prefill", p, 0, suffix_len, lambda pre=pre: model.prefill(0, pre),
                    count_flops(cfg, "prefill", n_pre + user))
        progress(f"P={p}: prefill {row.median_ms:.1f} ms ({row.gflops / row.matmul_gflops_near:.0%} of the matmul "
                 f"rate near it, {row.matmul_gflops_near:.1f} GFLOP/s)")
        for m in candidates:
            cands = rng.integers(1, cfg.num_items + 1, m)
            full = timed("full", p, m, 0, lambda hist=hist, cands=cands: model.rank_full(hist, cands),
                         count_flops(cfg, "full", p, m))

            def cached(suf=suf, cands=cands, n_pre=n_pre):
                return model.rank_cached(0, n_pre, suf, cands)

            cac = timed("cached", p, m, suffix_len, cached,
                        count_flops(cfg, "cached", suffix_len, m, past=n_pre + user))
            progress(f"P={p} M={m}: full {full.median_ms:.1f} ms ({full.gflops / full.matmul_gflops_near:.0%}), "
                     f"cached {cac.median_ms:.1f} ms ({cac.gflops / cac.matmul_gflops_near:.0%}), "
                     f"ratio {full.median_ms / cac.median_ms:.1f}x")
            for b in batches:
                requests = _batch_requests(model, cfg, p, user, suffix_len, cands, b)
                row = timed("cached_batch", p, m, suffix_len, lambda r=requests: model.rank_cached_batch(r),
                            b * count_flops(cfg, "cached", suffix_len, m, past=n_pre + user), batch=b)
                progress(f"P={p} M={m} B={b}: {row.median_ms:.1f} ms per call, {row.median_ms / b:.1f} ms per user "
                         f"(single call {cac.median_ms:.1f} ms: {cac.median_ms * b / row.median_ms:.2f}x)")
        if batches:
            chunk = min(config.trigger.prefill_chunk_len, p - user)
            chunks = _prefill_chunks(model, cfg, p, user, chunk, max(batches))
            flops = count_flops(cfg, "prefill", chunk, past=p - chunk)
            one = timed("prefill_chunk", p, 0, 0, lambda c=chunks[0]: model.prefill(c.slot, c.history, c.start),
                        flops, chunk_len=chunk)
            for b in batches:
                row = timed("prefill_batch", p, 0, 0, lambda c=chunks[:b]: model.prefill_batch(c), b * flops,
                            batch=b, chunk_len=chunk)
                progress(f"P={p} chunk {chunk} B={b}: {row.median_ms:.1f} ms per call, {row.median_ms / b:.1f} ms per "
                         f"user (one chunk alone {one.median_ms:.1f} ms: {one.median_ms * b / row.median_ms:.2f}x)")
    progress(f"matmul 2048^2 fp32 after the sweep: {probes[-1]:.1f} GFLOP/s "
             f"(range over the run {min(probes):.1f}-{max(probes):.1f})")
    matmul = max(probes)
    results = [dict(asdict(r), matmul_share=r.gflops / matmul, near_share=r.gflops / r.matmul_gflops_near)
               for r in rows]
    return {"matmul_gflops": matmul, "matmul_gflops_start": probes[0], "matmul_gflops_end": probes[-1],
            "matmul_gflops_all": probes, "backend": model.backend.name,
            "fused_kernels": model.backend.name == "fused_cpu", "repeats": repeats, "results": results}


def _batch_requests(model, cfg: ModelConfig, p: int, user: int, suffix_len: int, cands: np.ndarray,
                    batch: int) -> list:
    """`batch` users of P tokens each in slots 0..batch-1 (slot 0 holds the single-call user already)."""
    from mindspore_relaygr.model.ranker import CachedRank

    n_pre = p - user - suffix_len
    requests = []
    for slot in range(batch):
        hist = synthetic_history(cfg, p - user, seed=p if slot == 0 else p * 100 + slot)
        pre = {k: (v if k == "user_features" else v[:n_pre]) for k, v in hist.items()}
        suf = {k: v[n_pre:] for k, v in hist.items() if k != "user_features"}
        if model.slot_events(slot) != n_pre or slot > 0:
            model.release_slot(slot)
            for _ in model.prefill_steps(slot, pre, cfg.len_buckets[0]):
                pass
        requests.append(CachedRank(slot, n_pre, suf, cands))
    return requests


def _prefill_chunks(model, cfg: ModelConfig, p: int, user: int, chunk: int, batch: int) -> list:
    """The last `chunk` events of a P-token prefix for `batch` users in slots 0..batch-1, each slot holding the
    events before them."""
    from mindspore_relaygr.model.inputs import PrefillChunk, validate_history

    start = p - user - chunk
    chunks = []
    for slot in range(batch):
        hist = validate_history(cfg, synthetic_history(cfg, p - user, seed=p * 1000 + slot))
        model.release_slot(slot)
        if start:
            for _ in model.prefill_steps(slot, hist.slice(0, start), cfg.len_buckets[0]):
                pass
        chunks.append(PrefillChunk(slot, hist, start))
    return chunks


def format_table(report: dict[str, Any]) -> str:
    """A plain-text table: one row per (P, M) with the three paths side by side."""
    res = report["results"]
    by = {(r["path"], r["prefix_len"], r["candidates"]): r for r in res}
    head = (f"{'P':>5} {'M':>4} | {'full ms':>9} {'p99':>7} {'GF/s':>5} {'near':>4} {'%max':>4} | "
            f"{'prefill ms':>10} {'GF/s':>5} {'near':>4} {'%max':>4} | {'cached ms':>9} {'p99':>7} {'GF/s':>5} "
            f"{'near':>4} {'%max':>4} | {'full/cached':>11} | {'mem MB f/p/c':>14}")
    lines = [f"matmul 2048^2 GFLOP/s: {report['matmul_gflops_start']:.1f} before the sweep, "
             f"{report['matmul_gflops_end']:.1f} after it, {report['matmul_gflops']:.1f} fastest; "
             f"near = share of the faster measurement right before / after that path, %max = share of the fastest; "
             f"backend: {report['backend']}", head, "-" * len(head)]
    for r in res:
        if r["path"] != "full":
            continue
        p, m = r["prefix_len"], r["candidates"]
        pre, cac = by[("prefill", p, 0)], by[("cached", p, m)]
        lines.append(f"{p:>5} {m:>4} | {r['median_ms']:>9.1f} {r['p99_ms']:>7.1f} {r['gflops']:>5.0f} "
                     f"{r['near_share']:>4.0%} {r['matmul_share']:>4.0%} | {pre['median_ms']:>10.1f} "
                     f"{pre['gflops']:>5.0f} {pre['near_share']:>4.0%} {pre['matmul_share']:>4.0%} | "
                     f"{cac['median_ms']:>9.1f} {cac['p99_ms']:>7.1f} {cac['gflops']:>5.0f} "
                     f"{cac['near_share']:>4.0%} {cac['matmul_share']:>4.0%} | "
                     f"{r['median_ms'] / cac['median_ms']:>10.1f}x | "
                     f"{r['memory_mb']:>4.0f}/{pre['memory_mb']:>4.0f}/{cac['memory_mb']:>4.0f}")
    batched = [r for r in res if r["path"] == "cached_batch"]
    if batched:
        lines += ["", "Cached path, B users per call (rank_cached_batch) against B single calls:",
                  f"{'P':>5} {'M':>4} {'B':>3} | {'ms/call':>8} {'ms/user':>8} {'single ms':>9} | {'speed-up':>8}"]
        for r in batched:
            single = by[("cached", r["prefix_len"], r["candidates"])]["median_ms"]
            lines.append(f"{r['prefix_len']:>5} {r['candidates']:>4} {r['batch']:>3} | {r['median_ms']:>8.1f} "
                         f"{r['median_ms'] / r['batch']:>8.1f} {single:>9.1f} | "
                         f"{single * r['batch'] / r['median_ms']:>7.2f}x")
    chunked = [r for r in res if r["path"] == "prefill_batch"]
    if chunked:
        lines += ["", "Prefill, the last chunk of a P-token prefix for B users per call (prefill_batch) against one "
                  "user's chunk alone:",
                  f"{'P':>5} {'chunk':>5} {'B':>3} | {'ms/call':>8} {'ms/user':>8} {'single ms':>9} | {'speed-up':>8}"]
        for r in chunked:
            single = by[("prefill_chunk", r["prefix_len"], 0)]["median_ms"]
            lines.append(f"{r['prefix_len']:>5} {r['chunk_len']:>5} {r['batch']:>3} | {r['median_ms']:>8.1f} "
                         f"{r['median_ms'] / r['batch']:>8.1f} {single:>9.1f} | "
                         f"{single * r['batch'] / r['median_ms']:>7.2f}x")
    profiled = [r for r in res if r.get("gemm_gflops") is not None]
    if profiled:
        lines += ["", "Kernel profile (near = share of the matmul rate near the path; time = the threads' time over "
                  "the profiled calls: in the tile GEMMs, the fused elementwise work, the rest of the kernels' loops, "
                  "outside the kernels):",
                  f"{'path':>12} {'B':>2} {'P':>5} {'M':>4} | {'path GF/s':>9} {'near':>4} | "
                  f"{'GEMM GF/s':>9} {'near':>4} | "
                  f"{'FLOPs in GEMMs':>14} | {'GEMMs':>5} {'elementwise':>11} {'rest':>4} {'outside':>7}"]
        for r in profiled:
            near = r["matmul_gflops_near"]
            rest = r["kernel_time_share"] - r["gemm_time_share"] - r["elementwise_time_share"]
            lines.append(f"{r['path']:>12} {r.get('batch', 1):>2} {r['prefix_len']:>5} {r['candidates']:>4} | "
                         f"{r['gflops']:>9.0f} "
                         f"{r['gflops'] / near:>4.0%} | {r['gemm_gflops']:>9.0f} {r['gemm_gflops'] / near:>4.0%} | "
                         f"{r['gemm_flops_share']:>14.0%} | {r['gemm_time_share']:>5.0%} "
                         f"{r['elementwise_time_share']:>11.0%} {rest:>4.0%} {1 - r['kernel_time_share']:>7.0%}")
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: Path) -> None:
    """Write a benchmark's JSON, with the machine it ran on (`report["machine"]`, measured now unless the
    report has it already)."""
    from mindspore_relaygr.bench.machine import machine_info

    report.setdefault("machine", machine_info())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
