"""What the RelayEngine needs from a model instance (RelayGRModel; a numpy stand-in in tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from mindspore_relaygr.cache.hierarchy import SlotStore
from mindspore_relaygr.history import History
from mindspore_relaygr.model.inputs import CachedRank, PrefillChunk


class SlotGeometry(Protocol):
    """Sizes of one pool slot."""

    slot_len: int  # tokens a slot holds (user token included)
    num_layers: int

    @property
    def token_bytes(self) -> int: ...
    @property
    def slot_bytes(self) -> int: ...


class DeviceModel(SlotStore, Protocol):
    """A model with a device KV pool: the full graph, chunked prefill into a slot, the cached rank."""

    version: str
    num_slots: int
    layout: SlotGeometry
    prefix_buckets: Sequence[int]  # prefix-graph lengths compiled (the chunk sizes a prefill may use)

    def ensure_host_arena(self, nbytes: int) -> float: ...
    def warmup(self, max_chunk: int | None = None, max_batch: int = 1, max_prefill_batch: int = 1,
               progress: Callable[[str], None] | None = None) -> Any: ...
    def chunk_ends(self, num_events: int, chunk_len: int) -> list[int]: ...  # events cached after each chunk
    def prefill_batch(self, chunks: Sequence[PrefillChunk]) -> list[int]: ...  # one call, one slot per chunk
    def rank_full(self, history: History, candidate_ids: np.ndarray) -> np.ndarray: ...
    def rank_cached(self, slot: int, prefix_len: int, suffix_history: History,
                    candidate_ids: np.ndarray) -> np.ndarray: ...
    @property
    def batched_ranking(self) -> bool: ...  # rank_cached_batch runs several users in one device call
    def rank_cached_batch(self, requests: Sequence[CachedRank]) -> list[np.ndarray]: ...
