"""Slot bookkeeping of the device KV pool: key -> entry, states, pins, lifecycle and eviction.

Plain Python (no MindSpore): the graphs only ever see slot indices. An entry is RESERVED while its
prefill runs and READY once the slot holds the prefix. A RESERVED or pinned entry is never evicted.
When a slot is needed, the caller names the entries to keep if it can (`keep`: prefixes whose rank
may still come); the others go first, those past their deadline first (earliest deadline first),
then the least recently used; a kept entry goes only when nothing else can. A full pool is a normal
outcome: `allocate` returns None and the caller falls back to full inference. Whatever is evicted is
returned to the caller (who may copy the slot to host memory before reusing it); the manager never
calls anyone.
"""

from __future__ import annotations

import enum
import heapq
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass

from mindspore_relaygr.cache.keys import CacheKey

logger = logging.getLogger(__name__)

EVICTION_REASONS = ("expired", "lru", "kept", "released")  # kept: a `keep` entry, when nothing else could go


class EntryState(enum.Enum):
    RESERVED = "reserved"  # prefill running: the slot content is not valid yet
    READY = "ready"


@dataclass(frozen=True)
class SlotLease:
    """What a caller learns about a cached entry (a snapshot, never the entry itself)."""

    key: CacheKey
    slot: int
    state: EntryState
    prefix_len: int


@dataclass(frozen=True)
class Eviction:
    key: CacheKey
    slot: int
    was_used: bool  # the entry served at least one lookup or partial hit
    reason: str  # one of EVICTION_REASONS


@dataclass(frozen=True)
class Allocation:
    """A reserved slot, and the entry evicted to free it (its old content is still in the slot)."""

    lease: SlotLease
    evicted: Eviction | None


@dataclass
class CacheCounters:
    lookups: int = 0
    hits: int = 0
    misses: int = 0  # lookup() calls without an exact READY hit
    allocations: int = 0
    allocation_failures: int = 0
    aborts: int = 0
    evictions_expired: int = 0
    evictions_lru: int = 0
    evictions_kept: int = 0
    evictions_released: int = 0


@dataclass
class DeviceTierStats(CacheCounters):
    """The manager's counters and the pool's occupancy."""

    num_slots: int = 0
    num_free_slots: int = 0
    num_ready: int = 0
    num_reserved: int = 0
    bytes_in_use: int = 0


@dataclass
class _Entry:
    key: CacheKey
    slot: int
    state: EntryState
    lifetime_s: float
    last_use: float
    pins: int = 0
    used: bool = False

    @property
    def deadline(self) -> float:
        return self.last_use + self.lifetime_s

    def lease(self) -> SlotLease:
        return SlotLease(self.key, self.slot, self.state, self.key.prefix_len)


class KVCacheManager:
    """Maps cache keys to the `num_slots` slots of a device pool; thread-safe (one lock)."""

    def __init__(self, num_slots: int, slot_bytes: int, lifetime_ms: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots!r}: must be >= 1")
        if slot_bytes < 0:
            raise ValueError(f"slot_bytes={slot_bytes!r}: must be >= 0")
        if not lifetime_ms > 0:
            raise ValueError(f"lifetime_ms={lifetime_ms!r}: must be > 0")
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.lifetime_ms = lifetime_ms
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, _Entry] = {}
        self._by_user: dict[str, set[CacheKey]] = {}
        self._free = list(range(num_slots))  # a heap: the lowest free slot is handed out first
        self._counters = CacheCounters()

    def allocate(self, key: CacheKey, lifetime_ms: float | None = None,
                 keep: Collection[CacheKey] = ()) -> Allocation | None:
        """Reserve a slot for a new prefill of `key`, evicting if needed (entries in `keep` last); None
        when none can be freed. The new entry is RESERVED and only the caller writes it, so an evicted
        entry's data stays in the slot until the caller overwrites it."""
        lifetime_ms = self.lifetime_ms if lifetime_ms is None else lifetime_ms
        if not lifetime_ms > 0:
            raise ValueError(f"lifetime_ms={lifetime_ms!r}: must be > 0")
        eviction = None
        with self._lock:
            if key in self._entries:
                raise ValueError(f"key {key} is already cached (state {self._entries[key].state.name})")
            if self._free:
                slot = heapq.heappop(self._free)
            else:
                picked = self._pick_victim(keep)
                if picked is None:
                    self._counters.allocation_failures += 1
                    return None
                eviction = self._remove(*picked)
                slot = eviction.slot
            entry = _Entry(key, slot, EntryState.RESERVED, lifetime_ms / 1e3, self._clock())
            self._add(entry)
            self._counters.allocations += 1
            return Allocation(entry.lease(), eviction)

    def mark_ready(self, key: CacheKey) -> SlotLease:
        """The prefill of `key` finished: its slot now holds the prefix."""
        with self._lock:
            entry = self._get(key, EntryState.RESERVED, "mark ready")
            entry.state = EntryState.READY
            entry.last_use = self._clock()
            return entry.lease()

    def abort(self, key: CacheKey) -> None:
        """The prefill of `key` failed: drop the RESERVED entry and free its slot (no eviction hook)."""
        with self._lock:
            entry = self._get(key, EntryState.RESERVED, "abort")
            self._drop(entry)
            heapq.heappush(self._free, entry.slot)
            self._counters.aborts += 1

    def lookup(self, key: CacheKey, pin: bool = False) -> SlotLease | None:
        """Exact READY hit (refreshes its last use; `pin` pins it atomically), else None."""
        with self._lock:
            self._counters.lookups += 1
            entry = self._entries.get(key)
            if entry is None or entry.state is not EntryState.READY:
                self._counters.misses += 1
                return None
            self._counters.hits += 1
            return self._use(entry, pin)

    def peek(self, key: CacheKey) -> SlotLease | None:
        """The entry of `key` in any state, without counting or touching it."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.lease()

    def keys_of(self, user_id: str) -> list[CacheKey]:
        """Keys of the user's entries (any state), longest prefix first."""
        with self._lock:
            return sorted(self._by_user.get(user_id, ()), key=lambda k: -k.prefix_len)

    def leases(self) -> list[SlotLease]:
        """Snapshot of every entry, by slot."""
        with self._lock:
            return sorted((e.lease() for e in self._entries.values()), key=lambda lease: lease.slot)

    def rekey(self, old_key: CacheKey, new_key: CacheKey) -> SlotLease:
        """The READY entry of `old_key` was extended in place and now caches `new_key`'s prefix."""
        self._check_extension("rekey", old_key, new_key)
        with self._lock:
            entry = self._get(old_key, EntryState.READY, "rekey")
            if new_key in self._entries:
                raise ValueError(f"cannot rekey {old_key}: {new_key} is already cached "
                                 f"(state {self._entries[new_key].state.name})")
            self._drop(entry)
            entry.key = new_key
            entry.last_use = self._clock()
            self._add(entry)
            return entry.lease()

    def reopen(self, old_key: CacheKey, new_key: CacheKey) -> SlotLease:
        """The unpinned READY entry of `old_key` is about to be extended in place over several device
        steps: it becomes RESERVED under `new_key` (never evicted or used meanwhile); `mark_ready` or
        `abort` it like a new prefill."""
        self._check_extension("reopen", old_key, new_key)
        with self._lock:
            entry = self._get(old_key, EntryState.READY, "reopen")
            if entry.pins:
                raise ValueError(f"cannot reopen {old_key}: pinned {entry.pins} times")
            if new_key in self._entries:
                raise ValueError(f"cannot reopen {old_key}: {new_key} is already cached "
                                 f"(state {self._entries[new_key].state.name})")
            self._drop(entry)
            entry.key, entry.state, entry.last_use = new_key, EntryState.RESERVED, self._clock()
            self._add(entry)
            return entry.lease()

    @staticmethod
    def _check_extension(action: str, old_key: CacheKey, new_key: CacheKey) -> None:
        if (old_key.user_id, old_key.model_version) != (new_key.user_id, new_key.model_version) \
                or new_key.prefix_len <= old_key.prefix_len:
            raise ValueError(f"cannot {action} {old_key} to {new_key}: need the same user and version "
                             f"and a longer prefix")

    def pin(self, key: CacheKey) -> None:
        """Protect a READY entry from eviction until the matching `unpin`."""
        with self._lock:
            self._get(key, EntryState.READY, "pin").pins += 1

    def unpin(self, key: CacheKey) -> None:
        with self._lock:
            entry = self._get(key, None, "unpin")
            if entry.pins == 0:
                raise ValueError(f"cannot unpin {key}: it is not pinned (state {entry.state.name})")
            entry.pins -= 1

    def release(self, key: CacheKey) -> Eviction:
        """Drop an unpinned READY entry now and free its slot (reason "released")."""
        with self._lock:
            entry = self._get(key, EntryState.READY, "release (a failed prefill uses abort)")
            if entry.pins:
                raise ValueError(f"cannot release {key}: pinned {entry.pins} times (state {entry.state.name})")
            eviction = self._remove(entry, "released")
            heapq.heappush(self._free, eviction.slot)
            return eviction

    def evict_one(self, keep: Collection[CacheKey] = ()) -> Eviction | None:
        """Evict the best victim as `allocate` would and free its slot; None when every entry is
        RESERVED or pinned. The slot's old data is the caller's to copy before it allocates again."""
        with self._lock:
            picked = self._pick_victim(keep)
            if picked is None:
                return None
            eviction = self._remove(*picked)
            heapq.heappush(self._free, eviction.slot)
            return eviction

    def num_free_slots(self) -> int:
        with self._lock:
            return len(self._free)

    def bytes_in_use(self) -> int:
        with self._lock:
            return len(self._entries) * self.slot_bytes

    def stats(self) -> DeviceTierStats:
        with self._lock:
            states = [e.state for e in self._entries.values()]
            return DeviceTierStats(**asdict(self._counters), num_slots=self.num_slots,
                                   num_free_slots=len(self._free), num_ready=states.count(EntryState.READY),
                                   num_reserved=states.count(EntryState.RESERVED),
                                   bytes_in_use=len(self._entries) * self.slot_bytes)

    def _get(self, key: CacheKey, state: EntryState | None, action: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise ValueError(f"cannot {action} {key}: not cached")
        if state is not None and entry.state is not state:
            raise ValueError(f"cannot {action} {key}: state is {entry.state.name}, need {state.name}")
        return entry

    def _use(self, entry: _Entry, pin: bool) -> SlotLease:
        entry.last_use = self._clock()
        entry.used = True
        entry.pins += int(pin)
        return entry.lease()

    def _pick_victim(self, keep: Collection[CacheKey]) -> tuple[_Entry, str] | None:
        """The entry to evict and why: entries not in `keep` first (expired ones by earliest deadline,
        then the LRU one), then the LRU one of `keep`."""
        now = self._clock()
        candidates = [e for e in self._entries.values() if e.state is EntryState.READY and e.pins == 0]
        if not candidates:
            return None

        def order(e: _Entry) -> tuple[int, float]:
            if e.key in keep:
                return 2, e.last_use
            return (0, e.deadline) if e.deadline <= now else (1, e.last_use)

        victim = min(candidates, key=order)
        return victim, ("expired", "lru", "kept")[order(victim)[0]]

    def _add(self, entry: _Entry) -> None:
        self._entries[entry.key] = entry
        self._by_user.setdefault(entry.key.user_id, set()).add(entry.key)
        assert len(self._entries) + len(self._free) <= self.num_slots

    def _remove(self, entry: _Entry, reason: str) -> Eviction:
        """Drop an evictable entry and count it; its slot is not free yet."""
        assert entry.state is EntryState.READY and entry.pins == 0, entry
        self._drop(entry)
        setattr(self._counters, f"evictions_{reason}", getattr(self._counters, f"evictions_{reason}") + 1)
        logger.debug("evict %s from slot %d (%s)", entry.key, entry.slot, reason)
        return Eviction(entry.key, entry.slot, entry.used, reason)

    def _drop(self, entry: _Entry) -> None:
        del self._entries[entry.key]
        keys = self._by_user[entry.key.user_id]
        keys.discard(entry.key)
        if not keys:
            del self._by_user[entry.key.user_id]
