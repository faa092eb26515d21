"""Calibrate a LatencyModel by timing the model's compiled graphs at their bucket shapes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mindspore_relaygr.model.inputs import buckets_up_to, synthetic_history
from mindspore_relaygr.relay.latency import LatencyModel


def calibration_shapes(model: Any, prefill_chunk_len: int) -> dict[str, list[tuple[int, ...]]]:
    """Every bucket the engine can hit: full (tokens, candidates), relay (prefix, suffix, candidates),
    and prefill (tokens) as the engine runs it: chunked, measured at every chunk boundary, since
    a later chunk attends to everything before it and costs more than the first.
    Token counts are bucket sizes (the graphs cost the same below)."""
    cfg = model.cfg
    user = 1 if cfg.user_feature_sizes else 0
    prefix = model.prefix_buckets
    single_chunk = [p for p in prefix if p < prefill_chunk_len]
    boundaries = list(range(prefill_chunk_len, prefix[-1], prefill_chunk_len)) + [prefix[-1]]
    return {
        "full": [(n, m) for n in cfg.len_buckets for m in cfg.candidate_buckets],
        "relay": [(p, s, m) for p in prefix for s in cfg.suffix_buckets for m in cfg.candidate_buckets
                  if p - user + s + user <= cfg.max_seq_len],
        "prefill": [(n,) for n in sorted(set(single_chunk + boundaries))],
    }


def _drain(steps) -> None:
    for _ in steps:
        pass


def calibrate_latency(model: Any, prefill_chunk_len: int, repeats: int = 3, slot: int = 0,
                      max_batch: int = 1) -> LatencyModel:
    """Time the public paths (host work included) on every bucket; with `max_batch` > 1, also the batch factor
    of every batch bucket up to the one holding that many users (`measure_batch_factors`). Uses and then
    releases `slot`."""
    user = 1 if model.cfg.user_feature_sizes else 0
    cands = np.arange(1, model.cfg.max_candidates + 1)

    def measure(kind: str, shape: tuple[int, ...]) -> float:
        if kind == "full":
            n, m = shape
            args = (model.rank_full, synthetic_history(model.cfg, n - user, seed=n - user), cands[:m])
        elif kind == "prefill":
            (n,) = shape
            model.release_slot(slot)
            args = (_drain, model.prefill_steps(slot, synthetic_history(model.cfg, n - user, seed=n - user),
                                                prefill_chunk_len))
        else:
            p, s, m = shape
            hist = synthetic_history(model.cfg, p - user + s, seed=p - user + s)
            pre = {k: (v if k == "user_features" else v[: p - user]) for k, v in hist.items()}
            if model.slot_events(slot) != p - user:
                model.release_slot(slot)
                _drain(model.prefill_steps(slot, pre, prefill_chunk_len))  # the engine's (warmed) graphs
            suffix = {k: v[p - user:] for k, v in hist.items() if k != "user_features"}
            args = (model.rank_cached, slot, p - user, suffix, cands[:m])
        fn, *rest = args
        t0 = time.perf_counter()
        fn(*rest)
        return (time.perf_counter() - t0) * 1e3

    try:
        profile = LatencyModel.calibrate(measure, calibration_shapes(model, prefill_chunk_len), repeats=repeats)
        if max_batch > 1 and getattr(model, "batched_ranking", False):
            factors = measure_batch_factors(model, prefill_chunk_len, max_batch, repeats, slot)
            profile = LatencyModel(profile.points, profile.interpolation, factors)
        return profile
    finally:
        model.release_slot(slot)


def measure_batch_factors(model: Any, prefill_chunk_len: int, max_batch: int, repeats: int = 3,
                          slot: int = 0) -> dict[int, float]:
    """Per batch bucket B up to the one holding `max_batch` users: the median time of one `rank_cached_batch`
    call of B users over B times the median single `rank_cached` call, at the longest prefix a slot holds,
    the shortest suffix bucket and the most candidates (every user reads the same slot: the graph reads its
    slot in place whichever it is). Uses `slot`; the caller releases it."""
    from mindspore_relaygr.model.inputs import CachedRank

    cfg = model.cfg
    user = 1 if cfg.user_feature_sizes else 0
    suffix = cfg.suffix_buckets[0]
    prefix = min(model.prefix_buckets[-1], cfg.max_seq_len - suffix) - user
    hist = synthetic_history(cfg, prefix + suffix, seed=prefix + suffix)
    model.release_slot(slot)
    _drain(model.prefill_steps(slot, {k: (v if k == "user_features" else v[:prefix]) for k, v in hist.items()},
                               prefill_chunk_len))
    request = CachedRank(slot, prefix, {k: v[prefix:] for k, v in hist.items() if k != "user_features"},
                         np.arange(1, cfg.max_candidates + 1))

    def median_ms(fn, *args) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(times))

    single = median_ms(model.rank_cached, request.slot, request.prefix_len, request.suffix_history,
                       request.candidate_ids)
    factors = {1: 1.0}
    for bucket in buckets_up_to(cfg.batch_buckets, max_batch):
        if bucket > 1:
            factors[bucket] = median_ms(model.rank_cached_batch, [request] * bucket) / (bucket * single)
    return factors


def measure_copy_bytes_per_s(model: Any, prefill_chunk_len: int, repeats: int = 3, slot: int = 0) -> float:
    """DRAM -> device bandwidth of a slot reload (`import_slot`) of the longest prefix a slot holds,
    best of `repeats`; uses and then releases `slot` (call it on the device thread, before serving)."""
    user = 1 if model.cfg.user_feature_sizes else 0
    events = model.layout.slot_len - user
    try:
        model.release_slot(slot)
        _drain(model.prefill_steps(slot, synthetic_history(model.cfg, events, seed=events), prefill_chunk_len))
        copy = model.export_slot(slot)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.import_slot(slot, copy)
            best = min(best, time.perf_counter() - t0)
        return copy.nbytes / max(best, 1e-9)
    finally:
        model.release_slot(slot)
