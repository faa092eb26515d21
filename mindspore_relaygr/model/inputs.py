"""Host-side input handling: validation, token layout and padding to static buckets (numpy only).

A request's tokens are `[user token (optional) | events...]`; candidates come after them and share
one position (the one right after the last event) and one timestamp (the last event's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.errors import InvalidRequest
from mindspore_relaygr.history import History

HISTORY_FIELDS = ("item_ids", "action_ids", "timestamps")
MAX_ABS_TIMESTAMP = 2**40  # the (hi, lo) fp32 split is exact below this
TIME_HI_UNIT = 65536


def split_timestamps(timestamps: np.ndarray) -> np.ndarray:
    """int64 unix seconds [n] -> float32 [n, 2] (hi, lo): differences stay exact in fp32."""
    t = np.asarray(timestamps, dtype=np.int64)
    hi = np.floor_divide(t, TIME_HI_UNIT)
    return np.stack([hi, t - hi * TIME_HI_UNIT], axis=-1).astype(np.float32)


def bucket_for(n: int, buckets: Sequence[int], what: str) -> int:
    """Smallest bucket >= n."""
    for b in buckets:
        if n <= b:
            return b
    raise InvalidRequest(what, f"length {n} exceeds the largest bucket {buckets[-1]}")


def buckets_up_to(buckets: Sequence[int], n: int) -> list[int]:
    """The buckets (ascending) a batch of at most `n` can pad to: those below n and the smallest holding n."""
    holding = [b for b in buckets if b >= n][:1]
    return [b for b in buckets if b < n] + holding


def _int_array(name: str, value: Any, dtype: type) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InvalidRequest(name, f"must be a 1-D array, got shape {arr.shape}")
    if arr.size and arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise InvalidRequest(name, "must not contain NaN or infinity")
        if not np.all(arr == np.round(arr)):
            raise InvalidRequest(name, "must hold integers")
    elif arr.size and arr.dtype.kind not in "iu":
        raise InvalidRequest(name, f"must hold integers, got dtype {arr.dtype}")
    return arr.astype(dtype)


def _check_range(name: str, arr: np.ndarray, low: int, high: int) -> None:
    if arr.size and (arr.min() < low or arr.max() > high):
        bad = arr[(arr < low) | (arr > high)][0]
        raise InvalidRequest(name, f"id {bad} is out of range [{low}, {high}]")


def validate_history(cfg: ModelConfig, history: Mapping[str, Any] | History, name: str = "history") -> History:
    """Check a history dict (or History) against the model's vocabularies; raise InvalidRequest."""
    if isinstance(history, History):
        history = {"item_ids": history.item_ids, "action_ids": history.action_ids,
                   "timestamps": history.timestamps, "user_features": history.user_features}
    if not isinstance(history, Mapping):
        raise InvalidRequest(name, f"must be a mapping with {HISTORY_FIELDS}")
    for key in HISTORY_FIELDS:
        if key not in history:
            raise InvalidRequest(f"{name}.{key}", "is missing")
    items = _int_array(f"{name}.item_ids", history["item_ids"], np.int32)
    actions = _int_array(f"{name}.action_ids", history["action_ids"], np.int32)
    times = _int_array(f"{name}.timestamps", history["timestamps"], np.int64)
    if not (len(items) == len(actions) == len(times)):
        raise InvalidRequest(name, f"item_ids, action_ids and timestamps differ in length "
                                   f"({len(items)}, {len(actions)}, {len(times)})")
    _check_range(f"{name}.item_ids", items, 1, cfg.num_items)
    _check_range(f"{name}.action_ids", actions, 0, cfg.num_actions - 1)
    if times.size and np.abs(times).max() >= MAX_ABS_TIMESTAMP:
        raise InvalidRequest(f"{name}.timestamps", f"must be below {MAX_ABS_TIMESTAMP} in magnitude")
    check_chronological(f"{name}.timestamps", times)
    return History(items, actions, times, _user_features(cfg, history.get("user_features"), name))


def check_chronological(name: str, timestamps: Sequence[int] | np.ndarray) -> None:
    """Events are oldest first: equal timestamps are fine, a timestamp before its predecessor is an InvalidRequest.
    (The time buckets of the attention see the gaps between events; a reversed pair would be a negative gap.)"""
    times = np.asarray(timestamps)
    if times.size < 2:
        return
    back = np.flatnonzero(times[1:] < times[:-1])
    if back.size:
        i = int(back[0]) + 1
        raise InvalidRequest(name, f"must not decrease (oldest event first): {int(times[i])} at index {i} is before "
                                   f"{int(times[i - 1])} at index {i - 1}")


def _user_features(cfg: ModelConfig, value: Any, name: str) -> np.ndarray | None:
    sizes = cfg.user_feature_sizes
    if value is None:
        return np.zeros(len(sizes), np.int32) if sizes else None  # 0 = unknown
    if not sizes:
        raise InvalidRequest(f"{name}.user_features", "this model has no user features")
    feats = _int_array(f"{name}.user_features", value, np.int32)
    if len(feats) != len(sizes):
        raise InvalidRequest(f"{name}.user_features", f"expected {len(sizes)} values, got {len(feats)}")
    for i, (v, size) in enumerate(zip(feats, sizes, strict=True)):
        if not 0 <= v < size:
            raise InvalidRequest(f"{name}.user_features[{i}]", f"value {v} is out of range [0, {size})")
    return feats


def validate_candidates(cfg: ModelConfig, candidate_ids: Any, name: str = "candidate_ids") -> np.ndarray:
    cands = _int_array(name, candidate_ids, np.int32)
    if len(cands) == 0:
        raise InvalidRequest(name, "must not be empty")
    if len(cands) > cfg.max_candidates:
        raise InvalidRequest(name, f"{len(cands)} candidates exceed the maximum {cfg.max_candidates}")
    _check_range(name, cands, 1, cfg.num_items)
    return cands


def synthetic_history(cfg: ModelConfig, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A random chronological history of `n` events (benchmarks, calibration and the demo)."""
    rng = np.random.default_rng(seed)
    hist = {"item_ids": rng.integers(1, cfg.num_items + 1, n), "action_ids": rng.integers(0, cfg.num_actions, n),
            "timestamps": 1_700_000_000 + np.cumsum(rng.integers(0, 3600, n))}
    if cfg.user_feature_sizes:
        hist["user_features"] = np.ones(len(cfg.user_feature_sizes), np.int64)
    return hist


def user_offsets(cfg: ModelConfig) -> np.ndarray:
    """Row offset of each user feature in the single user-feature table."""
    return np.concatenate([[0], np.cumsum(cfg.user_feature_sizes)[:-1]]).astype(np.int32)


@dataclass(frozen=True)
class CachedRank:
    """One user's request of `RelayGRModel.rank_cached_batch`: the arguments of `rank_cached`."""

    slot: int
    prefix_len: int
    suffix_history: Any
    candidate_ids: Any


@dataclass(frozen=True)
class PrefillChunk:
    """One user's chunk of `RelayGRModel.prefill_batch`: the arguments of `prefill`."""

    slot: int
    history: Any
    start: int = 0


@dataclass(frozen=True)
class TokenBatch:
    """Padded arrays of new tokens, ready for a graph (all numpy)."""

    item_ids: np.ndarray  # int32 [B]
    action_ids: np.ndarray  # int32 [B]
    user_row: np.ndarray  # float32 [B], 1.0 where the user token sits
    positions: np.ndarray  # int32 [B]
    times: np.ndarray  # float32 [B, 2] (hi, lo)
    valid: np.ndarray  # bool [B]
    num_valid: int


def layout_tokens(cfg: ModelConfig, history: History, start_event: int, with_user_token: bool,
                  first_position: int, bucket: int, context_action: int, stop_event: int | None = None) -> TokenBatch:
    """Tokens for events [start_event, stop_event) (preceded by the user token if asked, which carries the
    history's first timestamp), padded to `bucket`."""
    ev = history.slice(start_event, stop_event)
    items, actions, times = ev.item_ids, ev.action_ids, ev.timestamps
    if with_user_token:
        first_time = history.timestamps[:1] if len(history) else np.zeros(1, np.int64)
        items = np.concatenate([[0], items])
        actions = np.concatenate([[context_action], actions])
        times = np.concatenate([first_time, times])
    n = len(items)
    if n > bucket:
        raise InvalidRequest("history", f"{n} tokens exceed the bucket {bucket}")
    pad = bucket - n
    user_row = np.zeros(bucket, np.float32)
    if with_user_token:
        user_row[0] = 1.0
    return TokenBatch(
        item_ids=np.pad(items, (0, pad)).astype(np.int32),
        action_ids=np.pad(actions, (0, pad)).astype(np.int32),
        user_row=user_row,
        positions=(first_position + np.arange(bucket)).astype(np.int32),
        times=np.pad(split_timestamps(times), ((0, pad), (0, 0))),
        valid=np.arange(bucket) < n,
        num_valid=n,
    )
