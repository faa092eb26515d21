"""Host-DRAM tier: copies of evicted device slots, with their own byte budget, LRU order and TTL.

Payloads are opaque (anything with an int `nbytes`, e.g. a dataclass of numpy arrays). A reload
back into the device pool is single-flight per key: concurrent callers share one copy and its
result (or its exception), and no copy is made while the device still holds the key.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from mindspore_relaygr.cache.keys import CacheKey
from mindspore_relaygr.config import SPILL_POLICIES

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class ExpanderCounters:
    puts: int = 0
    hits: int = 0
    misses: int = 0
    expirations: int = 0
    evictions: int = 0  # dropped (LRU) to make room
    refused: int = 0  # payloads larger than the whole budget
    reloads: int = 0  # copy_fn calls that returned
    reload_waits: int = 0  # callers that joined a reload already in flight
    skipped_reloads: int = 0  # the device still had the key, or recomputing was cheaper
    bytes_copied: int = 0


@dataclass
class DramTierStats(ExpanderCounters):
    """The expander's counters and its occupancy."""

    num_entries: int = 0
    bytes_in_use: int = 0


@dataclass
class _Stored:
    payload: Any
    nbytes: int
    expires_at: float


@dataclass
class _Flight:
    """One running reload; waiters block on `done`, then read `result` or `error`."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class DRAMExpander:
    """LRU + TTL host store of payloads keyed by CacheKey, bounded by `budget_bytes`; thread-safe."""

    def __init__(self, budget_bytes: float, ttl_s: float, spill_policy: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not budget_bytes > 0:
            raise ValueError(f"budget_bytes={budget_bytes!r}: must be > 0")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s={ttl_s!r}: must be > 0")
        if spill_policy not in SPILL_POLICIES:
            raise ValueError(f"spill_policy={spill_policy!r}: must be one of {SPILL_POLICIES}")
        self.budget_bytes = budget_bytes
        self.ttl_s = ttl_s
        self.spill_policy = spill_policy
        self._clock = clock
        self._lock = threading.Lock()
        self._items: OrderedDict[CacheKey, _Stored] = OrderedDict()  # least recently used first
        self._by_user: dict[str, set[CacheKey]] = {}
        self._bytes = 0
        self._flights: dict[CacheKey, _Flight] = {}
        self._counters = ExpanderCounters()

    def should_spill(self, was_used: bool) -> bool:
        """Whether a device eviction should be copied here, per the spill policy."""
        return self.spill_policy == "always" or (self.spill_policy == "used" and was_used)

    def put(self, key: CacheKey, payload: Any) -> bool:
        """Store (or replace) `payload`; evicts expired, then LRU entries for room. False if refused."""
        nbytes = getattr(payload, "nbytes", None)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"payload.nbytes={nbytes!r}: need an int >= 0 on {type(payload).__name__}")
        with self._lock:
            if nbytes > self.budget_bytes:
                self._counters.refused += 1
                logger.warning("refused %s: %d bytes exceed the DRAM budget %g", key, nbytes, self.budget_bytes)
                return False
            self._pop(key)
            self._drop_expired()
            while self._bytes + nbytes > self.budget_bytes:
                self._pop(next(iter(self._items)))
                self._counters.evictions += 1
            self._items[key] = _Stored(payload, nbytes, self._clock() + self.ttl_s)
            self._by_user.setdefault(key.user_id, set()).add(key)
            self._bytes += nbytes
            self._counters.puts += 1
            return True

    def peek(self, key: CacheKey) -> Any | None:
        """The payload of `key` without counting a lookup or refreshing its LRU position."""
        with self._lock:
            stored = self._live(key)
            return None if stored is None else stored.payload

    def get(self, key: CacheKey) -> Any | None:
        """The payload of `key` (now most recently used), or None if absent or expired."""
        with self._lock:
            stored = self._live(key)
            if stored is None:
                self._counters.misses += 1
                return None
            self._items.move_to_end(key)
            self._counters.hits += 1
            return stored.payload

    def contains(self, key: CacheKey) -> bool:
        with self._lock:
            return self._live(key) is not None

    def discard(self, key: CacheKey) -> bool:
        """Drop `key` if present; True if it was."""
        with self._lock:
            return self._pop(key) is not None

    def reload(self, key: CacheKey, copy_fn: Callable[[Any], T],
               device_has_copy: Callable[[], bool] | None = None) -> T | None:
        """`copy_fn(payload)` once for all concurrent callers of `key`; None if nothing was copied.

        Nothing is copied when `device_has_copy()` is true or the key is not stored here. An
        exception of `copy_fn` reaches every waiter; the next call tries again.
        """
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
            else:
                self._counters.reload_waits += 1
        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.result
        try:
            flight.result = self._reload_once(key, copy_fn, device_has_copy)
            return flight.result
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                del self._flights[key]
            flight.done.set()

    def record_reload(self, nbytes: int) -> None:
        """Count a copy back to the device made without `reload` (a stepped promotion)."""
        with self._lock:
            self._counters.reloads += 1
            self._counters.bytes_copied += nbytes

    def bytes_in_use(self) -> int:
        with self._lock:
            return self._bytes

    def keys_of(self, user_id: str) -> list[CacheKey]:
        """Keys of the user's live copies, longest prefix first."""
        with self._lock:
            keys = [k for k in list(self._by_user.get(user_id, ())) if self._live(k) is not None]  # _live may drop k
        return sorted(keys, key=lambda k: -k.prefix_len)

    def clear(self) -> int:
        """Drop every copy; returns how many there were."""
        with self._lock:
            count = len(self._items)
            for key in list(self._items):
                self._pop(key)
            return count

    def stats(self) -> DramTierStats:
        with self._lock:
            return DramTierStats(**asdict(self._counters), num_entries=len(self._items), bytes_in_use=self._bytes)

    def _reload_once(self, key: CacheKey, copy_fn: Callable[[Any], T],
                     device_has_copy: Callable[[], bool] | None) -> T | None:
        # Checked by the leader only, after the flight is registered: a caller arriving just after
        # a finished reload becomes the next leader and sees the device copy it made.
        if device_has_copy is not None and device_has_copy():
            with self._lock:
                self._counters.skipped_reloads += 1
            return None
        payload = self.get(key)
        if payload is None:
            return None
        result = copy_fn(payload)
        with self._lock:
            self._counters.reloads += 1
            self._counters.bytes_copied += payload.nbytes
        return result

    def _live(self, key: CacheKey) -> _Stored | None:
        """The stored entry of `key`, dropping it if expired (lock held)."""
        stored = self._items.get(key)
        if stored is not None and stored.expires_at <= self._clock():
            self._pop(key)
            self._counters.expirations += 1
            return None
        return stored

    def _drop_expired(self) -> None:
        now = self._clock()
        for key in [k for k, s in self._items.items() if s.expires_at <= now]:
            self._pop(key)
            self._counters.expirations += 1

    def _pop(self, key: CacheKey) -> _Stored | None:
        stored = self._items.pop(key, None)
        if stored is not None:
            self._bytes -= stored.nbytes
            keys = self._by_user[key.user_id]
            keys.discard(key)
            if not keys:
                del self._by_user[key.user_id]
        assert 0 <= self._bytes <= self.budget_bytes
        return stored
