"""Host-side inputs (numpy) of the graphs that run outside `RelayGRModel`: training and exported MindIR.

They follow `RelayGRModel`'s token layout exactly (user token first, candidates sharing the position and
timestamp right after the last event); tests compare the scores they produce with `rank_full`.
"""

from __future__ import annotations

import numpy as np

from mindspore_relaygr.config import ModelConfig
from mindspore_relaygr.model.inputs import (
    History,
    TokenBatch,
    bucket_for,
    layout_tokens,
    split_timestamps,
    user_offsets,
)

Arrays = tuple[np.ndarray, ...]


def _user_tokens(cfg: ModelConfig) -> int:
    return 1 if cfg.has_user_token else 0


def _user_feats(cfg: ModelConfig, history: History) -> np.ndarray:
    if not cfg.has_user_token:
        return np.zeros(1, np.int32)
    feats = history.user_features
    feats = np.zeros(len(cfg.user_feature_sizes), np.int32) if feats is None else feats
    return (np.asarray(feats, np.int32) + user_offsets(cfg)).astype(np.int32)


def _token_arrays(tokens: TokenBatch) -> Arrays:
    """(item_ids, action_ids, positions, time hi, time lo, valid)."""
    return (tokens.item_ids, tokens.action_ids, tokens.positions, tokens.times[:, 0].copy(),
            tokens.times[:, 1].copy(), tokens.valid)


def prefix_inputs(cfg: ModelConfig, history: History, bucket: int | None = None, num_events: int | None = None
                  ) -> Arrays:
    """Inputs of a graph over the first `num_events` (default all) events of `history` from position 0 (user
    token included): (item_ids, action_ids, user_feats, user_row, pos, hi, lo, valid), padded to `bucket`."""
    num_events = len(history) if num_events is None else num_events
    num_tokens = num_events + _user_tokens(cfg)
    bucket = bucket or bucket_for(num_tokens, cfg.len_buckets, "history")
    tokens = layout_tokens(cfg, history, 0, cfg.has_user_token, 0, bucket, cfg.num_actions, num_events)
    items, actions, pos, hi, lo, valid = _token_arrays(tokens)
    return items, actions, _user_feats(cfg, history), tokens.user_row, pos, hi, lo, valid


def candidate_inputs(cfg: ModelConfig, candidate_ids: np.ndarray, position: int, last_time: int,
                     bucket: int | None = None) -> Arrays:
    """(cand_ids padded with the first candidate, cand_pos [1], cand_hi [1], cand_lo [1])."""
    cands = np.asarray(candidate_ids, np.int32)
    bucket = bucket or bucket_for(len(cands), cfg.candidate_buckets, "candidate_ids")
    ids = np.pad(cands, (0, bucket - len(cands)), constant_values=cands[0]).astype(np.int32)
    hi, lo = split_timestamps(np.array([last_time]))[0]
    return ids, np.array([position], np.int32), np.array([hi], np.float32), np.array([lo], np.float32)


def last_time(history: History, fallback: int = 0) -> int:
    return int(history.timestamps[-1]) if len(history) else int(fallback)


def full_inputs(cfg: ModelConfig, history: History, candidate_ids: np.ndarray, len_bucket: int | None = None,
                candidate_bucket: int | None = None) -> Arrays:
    """The 13 inputs of `FullGraph` for `history` and the candidates (as `rank_full` lays them out)."""
    position = len(history) + _user_tokens(cfg)
    return (*prefix_inputs(cfg, history, len_bucket),
            *candidate_inputs(cfg, candidate_ids, position, last_time(history), candidate_bucket),
            np.array([max(position - 1, 0)], np.int32))


def suffix_inputs(cfg: ModelConfig, history: History, prefix_len: int, past_bucket: int,
                  suffix_bucket: int | None = None) -> tuple[Arrays, Arrays]:
    """Inputs of the pure candidate graph besides K/V and the candidates, for the first `prefix_len` events of
    `history` cached in `past_bucket` tokens: ((past_pos, past_hi, past_lo, past_valid), (item_ids, action_ids,
    pos, hi, lo, valid) of the other events)."""
    prefix_tok = prefix_len + _user_tokens(cfg)
    suffix = history.slice(prefix_len)
    past = prefix_inputs(cfg, history, past_bucket, prefix_len)
    past_meta = (np.arange(past_bucket, dtype=np.int32), past[5], past[6], np.arange(past_bucket) < prefix_tok)
    suffix_bucket = suffix_bucket or bucket_for(len(suffix), cfg.suffix_buckets, "suffix_history")
    tokens = layout_tokens(cfg, suffix, 0, False, prefix_tok, suffix_bucket, cfg.num_actions)
    return past_meta, _token_arrays(tokens)
