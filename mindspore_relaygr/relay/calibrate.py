"""Calibrate a LatencyModel by timing the model's compiled graphs at their bucket shapes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mindspore_relaygr.model.inputs import synthetic_history
from mindspore_relaygr.relay.latency import LatencyModel


def calibration_shapes(model: Any, prefill_chunk_len: int) -> dict[str, list[tuple[int, ...]]]:
    """Every bucket the engine can hit: full (tokens, candidates), relay (prefix, suffix, candidates),
    prefill (tokens) up to one chunk. Token counts are bucket sizes (the graphs cost the same below)."""
    cfg = model.cfg
    user = 1 if cfg.user_feature_sizes else 0
    prefix = model.prefix_buckets
    return {
        "full": [(n, m) for n in cfg.len_buckets for m in cfg.candidate_buckets],
        "relay": [(p, s, m) for p in prefix for s in cfg.suffix_buckets for m in cfg.candidate_buckets
                  if p - user + s + user <= cfg.max_seq_len],
        "prefill": [(p,) for p in prefix if p <= max(prefill_chunk_len, prefix[0])],
    }


def calibrate_latency(model: Any, prefill_chunk_len: int, repeats: int = 3, slot: int = 0) -> LatencyModel:
    """Time the public paths (host work included) on every bucket; uses and then releases `slot`."""
    user = 1 if model.cfg.user_feature_sizes else 0
    cands = np.arange(1, model.cfg.max_candidates + 1)

    def measure(kind: str, shape: tuple[int, ...]) -> float:
        if kind == "full":
            n, m = shape
            args = (model.rank_full, synthetic_history(model.cfg, n - user, seed=n - user), cands[:m])
        elif kind == "prefill":
            (n,) = shape
            args = (model.prefill, slot, synthetic_history(model.cfg, n - user, seed=n - user))
        else:
            p, s, m = shape
            hist = synthetic_history(model.cfg, p - user + s, seed=p - user + s)
            pre = {k: (v if k == "user_features" else v[: p - user]) for k, v in hist.items()}
            if model.slot_events(slot) != p - user:
                model.prefill(slot, pre)
            suffix = {k: v[p - user:] for k, v in hist.items() if k != "user_features"}
            args = (model.rank_cached, slot, p - user, suffix, cands[:m])
        fn, *rest = args
        t0 = time.perf_counter()
        fn(*rest)
        return (time.perf_counter() - t0) * 1e3

    try:
        return LatencyModel.calibrate(measure, calibration_shapes(model, prefill_chunk_len), repeats=repeats)
    finally:
        model.release_slot(slot)
