from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mindspore_relaygr.cache import CacheKey, EntryState, Eviction, KVCacheManager, SlotLease
from mindspore_relaygr.cache.manager import Allocation
from mindspore_relaygr.history import History

SLOT_BYTES = 100
LIFETIME_MS = 1000.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def key(name: str) -> CacheKey:
    return CacheKey(name, "v1", 1, "h-" + name)


class RecordingManager(KVCacheManager):
    """The manager, with every eviction it returns (from allocate, release, evict_one) in `seen`, and
    `allocate` answering the lease alone."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[Eviction] = []

    def allocate(self, k, lifetime_ms=None, keep=()):
        allocation = super().allocate(k, lifetime_ms, keep)
        if allocation is None:
            return None
        if allocation.evicted is not None:
            self.seen.append(allocation.evicted)
        return allocation.lease

    def release(self, k):
        self.seen.append(super().release(k))
        return self.seen[-1]

    def evict_one(self, keep=()):
        eviction = super().evict_one(keep)
        if eviction is not None:
            self.seen.append(eviction)
        return eviction


def make(num_slots: int = 2) -> tuple[RecordingManager, FakeClock, list[Eviction]]:
    clock = FakeClock()
    mgr = RecordingManager(num_slots, SLOT_BYTES, LIFETIME_MS, clock=clock)
    return mgr, clock, mgr.seen


def ready(mgr: KVCacheManager, name: str) -> SlotLease:
    mgr.allocate(key(name))
    return mgr.mark_ready(key(name))


def test_allocate_returns_the_entry_it_evicted_with_the_new_lease() -> None:
    mgr = KVCacheManager(1, SLOT_BYTES, LIFETIME_MS, clock=FakeClock())
    first = mgr.allocate(key("a"))
    assert first == Allocation(SlotLease(key("a"), 0, EntryState.RESERVED, 1), None)
    mgr.mark_ready(key("a"))
    assert mgr.allocate(key("b")) == Allocation(SlotLease(key("b"), 0, EntryState.RESERVED, 1),
                                                Eviction(key("a"), 0, False, "lru"))


def test_kept_entries_go_only_when_nothing_else_can() -> None:
    mgr, clock, seen = make(3)
    ready(mgr, "awaited")  # least recently used and long expired, but its rank may still come
    clock.now = 1.0
    ready(mgr, "consumed")
    clock.now = 1.5
    ready(mgr, "orphan")
    clock.now = 100.0
    keep = {key("awaited")}
    assert mgr.allocate(key("n1"), keep=keep).slot == 1
    assert mgr.allocate(key("n2"), keep=keep).slot == 2
    assert [e.key for e in seen] == [key("consumed"), key("orphan")]
    mgr.mark_ready(key("n1"))
    mgr.mark_ready(key("n2"))
    mgr.pin(key("n1"))
    mgr.pin(key("n2"))
    assert mgr.evict_one(keep) == Eviction(key("awaited"), 0, False, "kept")  # nothing else can go
    assert mgr.stats().evictions_kept == 1


def test_allocate_hands_out_lowest_free_slot_and_reuses_released_ones() -> None:
    mgr, _, seen = make(3)
    assert [mgr.allocate(key(n)).slot for n in "abc"] == [0, 1, 2]
    with pytest.raises(ValueError, match="already cached.*RESERVED"):
        mgr.allocate(key("a"))
    mgr.mark_ready(key("b"))
    assert mgr.release(key("b")) == Eviction(key("b"), 1, False, "released")
    assert seen == [Eviction(key("b"), 1, False, "released")]
    assert mgr.allocate(key("d")) == SlotLease(key("d"), 1, EntryState.RESERVED, 1)
    assert mgr.bytes_in_use() == 3 * SLOT_BYTES and mgr.num_free_slots() == 0


def test_expired_entries_go_before_lru_and_then_lru_order() -> None:
    mgr, clock, seen = make(3)
    mgr.allocate(key("old"), lifetime_ms=10_000)  # least recently used, but kept long
    mgr.mark_ready(key("old"))
    clock.now = 1.0
    ready(mgr, "short")  # deadline 2.0
    clock.now = 1.5
    ready(mgr, "mid")  # deadline 2.5
    clock.now = 3.0  # "short" and "mid" expired, "old" not
    assert mgr.allocate(key("n1")).slot == 1
    assert mgr.allocate(key("n2")).slot == 2
    mgr.mark_ready(key("n1"))
    mgr.mark_ready(key("n2"))
    assert mgr.evict_one() == Eviction(key("old"), 0, False, "lru")
    assert seen == [Eviction(key("short"), 1, False, "expired"), Eviction(key("mid"), 2, False, "expired"),
                    Eviction(key("old"), 0, False, "lru")]
    assert mgr.stats().evictions_expired == 2 and mgr.stats().evictions_lru == 1


def test_lookup_refreshes_recency_and_marks_used() -> None:
    mgr, clock, seen = make(2)
    ready(mgr, "a")
    clock.now = 0.1
    ready(mgr, "b")
    clock.now = 0.2
    assert mgr.lookup(key("a")) == SlotLease(key("a"), 0, EntryState.READY, 1)
    assert mgr.allocate(key("c")).slot == 1  # "b" is now the LRU entry
    assert seen == [Eviction(key("b"), 1, False, "lru")]
    clock.now = 0.3
    assert mgr.evict_one() == Eviction(key("a"), 0, True, "lru")
    assert mgr.evict_one() is None  # only the RESERVED "c" is left


def test_full_of_pinned_or_reserved_returns_none() -> None:
    mgr, clock, seen = make(2)
    ready(mgr, "a")
    mgr.allocate(key("b"))
    mgr.pin(key("a"))
    clock.now = 100.0  # "a" is long expired, but pinned
    assert mgr.allocate(key("c")) is None and mgr.evict_one() is None
    assert seen == [] and mgr.stats().allocation_failures == 1
    with pytest.raises(ValueError, match="pinned"):
        mgr.release(key("a"))
    mgr.unpin(key("a"))
    with pytest.raises(ValueError, match="not pinned"):
        mgr.unpin(key("a"))
    assert mgr.allocate(key("c")).slot == 0 and seen == [Eviction(key("a"), 0, False, "expired")]


def test_wrong_transitions_name_the_state() -> None:
    mgr, _, _ = make(2)
    mgr.allocate(key("r"))
    ready(mgr, "a")
    with pytest.raises(ValueError, match="state is READY"):
        mgr.mark_ready(key("a"))
    with pytest.raises(ValueError, match="state is READY"):
        mgr.abort(key("a"))
    with pytest.raises(ValueError, match="abort.*state is RESERVED"):
        mgr.release(key("r"))
    with pytest.raises(ValueError, match="state is RESERVED"):
        mgr.pin(key("r"))
    with pytest.raises(ValueError, match="not cached"):
        mgr.mark_ready(key("zz"))
    assert mgr.lookup(key("r")) is None
    assert mgr.peek(key("r")) == SlotLease(key("r"), 0, EntryState.RESERVED, 1)
    mgr.abort(key("r"))
    assert mgr.leases() == [SlotLease(key("a"), 1, EntryState.READY, 1)] and mgr.num_free_slots() == 1
    stats = mgr.stats()
    assert (stats.lookups, stats.misses, stats.aborts) == (1, 1, 1)


def history(n: int) -> History:
    return History(np.arange(1, n + 1, dtype=np.int32), np.zeros(n, np.int32), 1000 + np.arange(n, dtype=np.int64))


def test_keys_of_lists_a_users_entries_longest_first_then_rekey() -> None:
    mgr, _, _ = make(4)
    h = history(10)
    keys = {n: CacheKey.for_history("u", "v1", h, n) for n in (3, 6, 10)}
    for n in (3, 6, 10):
        mgr.allocate(keys[n])
    mgr.mark_ready(keys[3])
    mgr.mark_ready(keys[10])
    other = CacheKey.for_history("w", "v1", h, 8)
    mgr.allocate(other)
    assert mgr.keys_of("u") == [keys[10], keys[6], keys[3]] and mgr.keys_of("w") == [other]
    assert mgr.keys_of("nobody") == []
    mgr.abort(keys[6])
    assert mgr.keys_of("u") == [keys[10], keys[3]]

    mgr.pin(keys[3])
    new = CacheKey.for_history("u", "v1", h, 8)
    assert mgr.rekey(keys[3], new) == SlotLease(new, 0, EntryState.READY, 8)
    assert mgr.lookup(keys[3]) is None and mgr.lookup(new).slot == 0
    assert mgr.keys_of("u") == [keys[10], new]
    mgr.unpin(new)  # the pin moved with the entry
    for bad_new in (keys[10], CacheKey.for_history("u", "v1", h, 5), CacheKey.for_history("w", "v1", h, 9)):
        with pytest.raises(ValueError, match="cannot rekey"):
            mgr.rekey(new, bad_new)
    mgr.release(new)
    assert mgr.keys_of("u") == [keys[10]]


@dataclass
class Model:
    state: EntryState
    last_use: float
    lifetime_s: float
    pins: int = 0


class ManagerMachine(RuleBasedStateMachine):
    """Every step is checked against a plain model of the entries; invariants run after each step."""

    NAMES = st.sampled_from("abcdef")

    def __init__(self) -> None:
        super().__init__()
        self.mgr, self.clock, self.seen = make(3)
        self.model: dict[CacheKey, Model] = {}

    def has(self, k: CacheKey, state: EntryState | None = None) -> bool:
        return k in self.model and state in (None, self.model[k].state)

    def evictable(self, k: CacheKey) -> bool:
        return self.has(k, EntryState.READY) and self.model[k].pins == 0

    def expect(self, ok: bool, method: str, *args) -> bool:
        """mgr.method(*args) must succeed iff `ok`, else raise ValueError; its result goes to self.result."""
        if ok:
            self.result = getattr(self.mgr, method)(*args)
        else:
            with pytest.raises(ValueError):
                getattr(self.mgr, method)(*args)
        return ok

    def check_evictions(self, keep: frozenset = frozenset()) -> None:
        expired = {k for k, m in self.model.items() if m.last_use + m.lifetime_s <= self.clock.now}
        for ev in self.seen:
            assert self.evictable(ev.key), f"evicted a RESERVED or pinned entry: {ev}"
            others = [k for k in self.model if self.evictable(k) and k not in keep]
            assert (ev.reason == "kept") == (ev.key in keep)
            assert ev.reason != "kept" or not others, "evicted a kept entry while another could go"
            assert ev.reason == "kept" or (ev.reason == "expired") == (ev.key in expired)
            assert ev.reason != "lru" or not any(k in expired for k in others)
            del self.model[ev.key]
        self.seen.clear()

    @rule(name=NAMES, lifetime_ms=st.sampled_from([None, 300.0, 5000.0]),
          keep=st.frozensets(NAMES.map(key), max_size=3))
    def allocate(self, name: str, lifetime_ms: float | None, keep: frozenset) -> None:
        k = key(name)
        if not self.expect(k not in self.model, "allocate", k, lifetime_ms, keep):
            return
        self.check_evictions(keep)
        if self.result is None:
            assert len(self.model) == 3 and not any(self.evictable(x) for x in self.model)
            return
        assert self.result == SlotLease(k, self.result.slot, EntryState.RESERVED, 1)
        self.model[k] = Model(EntryState.RESERVED, self.clock.now, (lifetime_ms or LIFETIME_MS) / 1e3)

    @rule(name=NAMES)
    def mark_ready(self, name: str) -> None:
        k = key(name)
        if self.expect(self.has(k, EntryState.RESERVED), "mark_ready", k):
            self.model[k].state, self.model[k].last_use = EntryState.READY, self.clock.now

    @rule(name=NAMES, pin=st.booleans())
    def lookup(self, name: str, pin: bool) -> None:
        k = key(name)
        lease = self.mgr.lookup(k, pin)
        assert (lease is not None) == self.has(k, EntryState.READY)
        if lease is not None:
            assert lease.key == k
            self.model[k].pins += pin
            self.model[k].last_use = self.clock.now

    @rule(name=NAMES)
    def pin(self, name: str) -> None:
        if self.expect(self.has(key(name), EntryState.READY), "pin", key(name)):
            self.model[key(name)].pins += 1

    @rule(name=NAMES)
    def unpin(self, name: str) -> None:
        if self.expect(self.has(key(name)) and self.model[key(name)].pins > 0, "unpin", key(name)):
            self.model[key(name)].pins -= 1

    @rule(name=NAMES)
    def release(self, name: str) -> None:
        if self.expect(self.evictable(key(name)), "release", key(name)):
            assert self.seen == [Eviction(key(name), self.result.slot, self.result.was_used, "released")]
            self.seen.clear()
            del self.model[key(name)]

    @rule(name=NAMES)
    def abort(self, name: str) -> None:
        if self.expect(self.has(key(name), EntryState.RESERVED), "abort", key(name)):
            del self.model[key(name)]

    @rule(dt=st.sampled_from([0.1, 0.4, 2.0, 10.0]))
    def advance(self, dt: float) -> None:
        self.clock.now += dt

    @rule(keep=st.frozensets(NAMES.map(key), max_size=3))
    def evict_one(self, keep: frozenset) -> None:
        had_victim = any(self.evictable(k) for k in self.model)
        eviction = self.mgr.evict_one(keep)
        assert (eviction is not None) == had_victim and self.seen == ([eviction] if eviction else [])
        self.check_evictions(keep)

    @invariant()
    def matches_model(self) -> None:
        leases = self.mgr.leases()
        slots = [lease.slot for lease in leases]
        assert len(slots) == len(set(slots)) and all(0 <= s < 3 for s in slots)
        assert {lease.key: lease.state for lease in leases} == {k: m.state for k, m in self.model.items()}
        assert self.mgr.bytes_in_use() == len(self.model) * SLOT_BYTES <= 3 * SLOT_BYTES
        assert self.mgr.num_free_slots() == 3 - len(self.model)


ManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_manager_state_machine = ManagerMachine.TestCase


def test_reopen_turns_a_ready_entry_into_a_reservation_of_its_longer_prefix():
    mgr, _, evictions = make(num_slots=1)
    h = History(np.arange(1, 13), np.zeros(12, np.int64), np.arange(12))
    short, longer = CacheKey.for_history("u", "v1", h, 6), CacheKey.for_history("u", "v1", h, 12)
    mgr.allocate(short)
    mgr.mark_ready(short)
    mgr.pin(short)
    with pytest.raises(ValueError, match="cannot reopen .* pinned 1 times"):
        mgr.reopen(short, longer)
    mgr.unpin(short)
    with pytest.raises(ValueError, match="cannot reopen"):
        mgr.reopen(short, CacheKey.for_history("u", "v1", h, 4))  # not longer
    assert mgr.reopen(short, longer) == SlotLease(longer, 0, EntryState.RESERVED, 12)
    assert mgr.peek(short) is None and mgr.keys_of("u") == [longer]
    assert mgr.allocate(CacheKey.for_history("w", "v1", h, 3)) is None  # a reservation is never evicted
    mgr.mark_ready(longer)
    assert mgr.lookup(longer).slot == 0 and evictions == []
