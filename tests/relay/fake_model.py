"""A numpy stand-in for RelayGRModel as the engine uses it (no MindSpore): the engine, ledger and
cache tiers run for real, the graphs are FakeStore's exact-sequence oracle (a slot that does not
hold exactly the prefix of the history gives different scores)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.model.inputs import validate_candidates, validate_history
from tests.cache.fake_store import FakeStore, score


@dataclass(frozen=True)
class FakeLayout:
    slot_len: int
    num_layers: int = 2
    token_bytes: int = 100

    @property
    def slot_bytes(self) -> int:
        return self.token_bytes * self.slot_len


class FakeModel(FakeStore):
    """RelayGRModel's engine-facing surface over FakeStore; `corrupt(slot)` perturbs a slot's content."""

    def __init__(self, config: RelayGRConfig) -> None:
        super().__init__(config.cache.num_slots)
        self.cfg = config.model
        self.layout = FakeLayout(config.cache.max_prefix_len)
        self.batch_calls: list[int] = []  # the size of every rank_cached_batch call
        self.prefill_calls: list[int] = []  # the size of every prefill_batch call
        self.version = config.model.version
        self.prefix_buckets = [b for b in config.model.len_buckets if b <= config.cache.max_prefix_len]
        self.events_computed = 0  # prefix events written by prefill (the work a relay saves or spends)

    def ensure_host_arena(self, nbytes: int) -> float:
        return 0.0

    def prefill(self, slot, history, start=0):
        hist = validate_history(self.cfg, history)
        self.events_computed += len(hist) - start
        return super().prefill(slot, hist, start)

    def chunk_ends(self, num_events: int, chunk_len: int) -> list[int]:
        return list(range(chunk_len, num_events, chunk_len)) + [num_events] if num_events else []

    def prefill_batch(self, chunks):
        self.prefill_calls.append(len(chunks))
        return [self.prefill(c.slot, c.history, c.start) for c in chunks]

    def rank_full(self, history: Any, candidate_ids: Any) -> np.ndarray:
        hist = validate_history(self.cfg, history)
        return np.tile(super().rank_full(hist, validate_candidates(self.cfg, candidate_ids)), (1, 2))

    def rank_cached(self, slot, prefix_len, suffix, candidate_ids):
        return np.tile(super().rank_cached(slot, prefix_len, suffix, validate_candidates(self.cfg, candidate_ids)),
                       (1, 2))

    batched_ranking = True  # rank_cached_batch: one "device call" for several users (counted in batch_calls)

    def rank_cached_batch(self, requests):
        self.batch_calls.append(len(requests))
        return [self.rank_cached(r.slot, r.prefix_len, r.suffix_history, r.candidate_ids) for r in requests]

    def corrupt(self, slot: int) -> None:
        user, held = self.slots[slot]
        item, action, ts = held[0]
        self.slots[slot] = (user, [(item + 1, action, ts), *held[1:]])


__all__ = ["FakeModel", "score"]
