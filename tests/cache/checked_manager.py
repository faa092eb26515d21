"""A KVCacheManager that checks WHICH entry each of its evictions takes, against the documented victim order.

It keeps a shadow of its entries from its public calls alone (state, pins, last use, lifetime, on the same
clock) and, whenever a slot is freed by eviction, asserts that the victim is the one the order names: entries
not in `keep` first, those past their lifetime by earliest deadline, then the least recently used; a `keep`
entry only when nothing else can go (least recently used first); RESERVED and pinned entries never. Entries
whose last use ties are equally right. Install it where production builds its manager to check production's
own evictions (callers must not move the clock while a call of the manager runs). A violation raises and is
also kept in `violations`: on the engine's device thread a prefill's exception only fails that prefill.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from mindspore_relaygr.cache.keys import CacheKey
from mindspore_relaygr.cache.manager import Allocation, Eviction, KVCacheManager, SlotLease


@dataclass
class Shadow:
    ready: bool
    last_use: float
    lifetime_s: float
    pins: int = 0

    @property
    def deadline(self) -> float:
        return self.last_use + self.lifetime_s


def expected_victims(shadow: Mapping[CacheKey, Shadow], keep: Collection[CacheKey],
                     now: float) -> tuple[set[CacheKey], str | None]:
    """The entries the victim order allows to go now (ties included) and the reason; (set(), None): none."""
    evictable = {k: s for k, s in shadow.items() if s.ready and s.pins == 0}
    others = {k: s for k, s in evictable.items() if k not in keep}
    expired = {k: s for k, s in others.items() if s.deadline <= now}
    kept = {k: s for k, s in evictable.items() if k in keep}
    for pool, reason, order in ((expired, "expired", lambda s: s.deadline), (others, "lru", lambda s: s.last_use),
                                (kept, "kept", lambda s: s.last_use)):
        if pool:
            best = min(order(s) for s in pool.values())
            return {k for k, s in pool.items() if order(s) == best}, reason
    return set(), None


class CheckedManager(KVCacheManager):
    """KVCacheManager whose evictions are checked (see the module doc); `checked` counts them by reason,
    `violations` lists what went wrong.

    expected_keep: if given, the `keep` every eviction is made with must equal what it returns then (e.g. the
    ledger's awaited relays, which the engine must hand the cache)."""

    def __init__(self, num_slots: int, slot_bytes: int, lifetime_ms: float, clock: Callable[[], float],
                 expected_keep: Callable[[], Collection[CacheKey]] | None = None) -> None:
        super().__init__(num_slots, slot_bytes, lifetime_ms, clock=clock)
        self.clock, self.expected_keep = clock, expected_keep
        self.shadow: dict[CacheKey, Shadow] = {}
        self.checked: Counter[str] = Counter()
        self.violations: list[str] = []

    def _require(self, ok: bool, message: str) -> None:
        if not ok:
            self.violations.append(message)
            raise AssertionError(message)

    def _expect(self, keep: Collection[CacheKey]) -> tuple[set[CacheKey], str | None]:
        if self.expected_keep is not None:
            expected = set(self.expected_keep())
            self._require(set(keep) == expected, f"evicting with keep={set(keep)}, expected {expected}")
        return expected_victims(self.shadow, keep, self.clock())

    def _check(self, eviction: Eviction | None, expected: tuple[set[CacheKey], str | None]) -> None:
        victims, reason = expected
        if eviction is None:
            self._require(not victims, f"nothing evicted though {victims} could go ({reason})")
            return
        self._require(eviction.key in victims and eviction.reason == reason,
                      f"evicted {eviction.key} ({eviction.reason}); the victim order names {victims} ({reason})")
        del self.shadow[eviction.key]
        self.checked[reason] += 1

    def allocate(self, key: CacheKey, lifetime_ms: float | None = None,
                 keep: Collection[CacheKey] = ()) -> Allocation | None:
        full = len(self.shadow) == self.num_slots
        expected = self._expect(keep) if full else (set(), None)
        allocation = super().allocate(key, lifetime_ms, keep)
        if allocation is None:
            self._require(full and not expected[0], f"no slot given though {expected[0]} could go")
            return None
        if full:
            self._check(allocation.evicted, expected)
        else:
            self._require(allocation.evicted is None, f"evicted {allocation.evicted} with a free slot")
        lifetime_s = (self.lifetime_ms if lifetime_ms is None else lifetime_ms) / 1e3
        self.shadow[key] = Shadow(False, self.clock(), lifetime_s)
        return allocation

    def evict_one(self, keep: Collection[CacheKey] = ()) -> Eviction | None:
        expected = self._expect(keep)
        eviction = super().evict_one(keep)
        self._check(eviction, expected)
        return eviction

    def mark_ready(self, key: CacheKey) -> SlotLease:
        lease = super().mark_ready(key)
        self.shadow[key].ready, self.shadow[key].last_use = True, self.clock()
        return lease

    def abort(self, key: CacheKey) -> None:
        super().abort(key)
        del self.shadow[key]

    def lookup(self, key: CacheKey, pin: bool = False) -> SlotLease | None:
        lease = super().lookup(key, pin)
        if lease is not None:
            self.shadow[key].last_use = self.clock()
            self.shadow[key].pins += int(pin)
        return lease

    def rekey(self, old_key: CacheKey, new_key: CacheKey) -> SlotLease:
        lease = super().rekey(old_key, new_key)
        self.shadow[new_key] = self.shadow.pop(old_key)
        self.shadow[new_key].last_use = self.clock()
        return lease

    def reopen(self, old_key: CacheKey, new_key: CacheKey) -> SlotLease:
        lease = super().reopen(old_key, new_key)
        entry = self.shadow[new_key] = self.shadow.pop(old_key)
        entry.ready, entry.last_use = False, self.clock()
        return lease

    def pin(self, key: CacheKey) -> None:
        super().pin(key)
        self.shadow[key].pins += 1

    def unpin(self, key: CacheKey) -> None:
        super().unpin(key)
        self.shadow[key].pins -= 1

    def release(self, key: CacheKey) -> Eviction:
        eviction = super().release(key)
        del self.shadow[key]
        return eviction
