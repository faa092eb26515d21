"""Cache keys: which user, model version and exact event prefix a cached KV slot holds."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from mindspore_relaygr.history import History

DIGEST_BYTES = 16


def prefix_hash(history: History, num_events: int) -> str:
    """Stable hex digest of the first `num_events` events and the user features of `history`."""
    if isinstance(num_events, bool) or not isinstance(num_events, (int, np.integer)) \
            or not 0 <= num_events <= len(history):
        raise ValueError(f"num_events={num_events!r}: must be an int in [0, {len(history)}]")
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    h.update(int(num_events).to_bytes(8, "little"))  # field lengths follow from it: no separators needed
    h.update(np.ascontiguousarray(history.item_ids[:num_events], dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(history.action_ids[:num_events], dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(history.timestamps[:num_events], dtype="<i8").tobytes())
    if history.user_features is None:
        h.update(b"\x00")
    else:
        feats = np.ascontiguousarray(history.user_features, dtype="<i4")
        h.update(b"\x01" + len(feats).to_bytes(8, "little") + feats.tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class CacheKey:
    """Identity of a cached prefix: its first `prefix_len` events (user token not counted)."""

    user_id: str
    model_version: str
    prefix_len: int
    prefix_hash: str

    @classmethod
    def for_history(cls, user_id: str, model_version: str, history: History, prefix_len: int) -> CacheKey:
        """Key of the first `prefix_len` events of `history`."""
        return cls(user_id, model_version, int(prefix_len), prefix_hash(history, prefix_len))

    def __str__(self) -> str:
        return f"{self.user_id}@{self.model_version}[:{self.prefix_len}]#{self.prefix_hash[:8]}"
