"""A SlotStore double: scores are a deterministic function of the exact token sequence.

`rank_cached` rebuilds the sequence from what the slot really holds, so it equals `rank_full`
only if the slot holds exactly the prefix of the history: a strong oracle for cache correctness.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from mindspore_relaygr.history import History


def events(history: History) -> list[tuple[int, int, int]]:
    return list(zip(history.item_ids.tolist(), history.action_ids.tolist(), history.timestamps.tolist(), strict=True))


def score(user: tuple, seq: list[tuple[int, int, int]], cands) -> np.ndarray:
    out = []
    for c in np.asarray(cands).tolist():
        digest = hashlib.blake2b(repr((user, seq, c)).encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") / 2**64)
    return np.array(out)[:, None]


@dataclass(frozen=True)
class FakeCopy:
    user: tuple
    seq: tuple
    nbytes: int


class FakeStore:
    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self.slots: dict[int, tuple[tuple, list]] = {}
        self.calls: list[str] = []

    def _user(self, history: History) -> tuple:
        return () if history.user_features is None else tuple(history.user_features.tolist())

    def prefill(self, slot: int, history: History, start: int = 0) -> int:
        self.calls.append("prefill")
        user, held = self.slots.get(slot, (self._user(history), []))
        if start > len(held):
            raise ValueError(f"slot {slot} holds {len(held)} events, cannot extend from {start}")
        self.slots[slot] = (self._user(history), held[:start] + events(history)[start:])
        return len(history)

    def rank_cached(self, slot: int, prefix_len: int, suffix: History, cands) -> np.ndarray:
        self.calls.append("rank_cached")
        user, held = self.slots[slot]
        if prefix_len > len(held):
            raise ValueError("prefix_len beyond what the slot holds")
        return score(user, held[:prefix_len] + events(suffix), cands)

    def rank_full(self, history: History, cands) -> np.ndarray:
        return score(self._user(history), events(history), cands)

    def export_slot(self, slot: int) -> FakeCopy:
        self.calls.append("export")
        user, held = self.slots[slot]
        return FakeCopy(user, tuple(held), nbytes=100 * len(held))

    def import_slot(self, slot: int, copy: FakeCopy) -> None:
        for _ in self.import_slot_steps(slot, copy):
            pass

    def import_slot_steps(self, slot: int, copy: FakeCopy):
        """Two steps, like a two-layer model: the slot is whole only after the last."""
        self.calls.append("import")
        self.slots.pop(slot, None)
        yield 1
        self.slots[slot] = (copy.user, list(copy.seq))

    def release_slot(self, slot: int) -> None:
        self.slots.pop(slot, None)
