"""RelayCache: tiers, extension, spill/reload and R2, on a fake store and on the real tiny model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mindspore_relaygr.cache import DRAMExpander, KVCacheManager
from mindspore_relaygr.cache.hierarchy import SPILLED, RelayCache
from mindspore_relaygr.model.inputs import History
from tests.cache.fake_store import FakeStore

SLOT_BYTES = 1000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_history(rng: np.random.Generator, n: int, feats=(1, 2)) -> History:
    return History(rng.integers(1, 50, n).astype(np.int32), rng.integers(0, 4, n).astype(np.int32),
                   (1_600_000_000 + np.cumsum(rng.integers(0, 100, n))).astype(np.int64),
                   np.asarray(feats, np.int32))


def grow(h: History, rng: np.random.Generator, k: int) -> History:
    more = make_history(rng, k)
    return History(np.r_[h.item_ids, more.item_ids], np.r_[h.action_ids, more.action_ids],
                   np.r_[h.timestamps, h.timestamps[-1] + np.arange(1, k + 1)], h.user_features)


def build(num_slots=2, dram=True, spill_policy="always", clock=None, **kw):
    clock = clock or Clock()
    store = FakeStore(num_slots)
    manager = KVCacheManager(num_slots, SLOT_BYTES, lifetime_ms=1000.0, clock=clock)
    expander = DRAMExpander(50_000, ttl_s=60.0, spill_policy=spill_policy, clock=clock) if dram else None
    opts = {"max_suffix_len": 4, "max_extend_len": 10, "max_prefix_len": 60, **kw}
    return RelayCache(store, manager, expander, model_version="v1", **opts), store, clock


def test_device_hit_then_suffix_then_miss_on_any_change():
    cache, store, _ = build()
    rng = np.random.default_rng(0)
    h = make_history(rng, 20)
    assert cache.prefill("u", h) is not None
    cands = [1, 2, 3]
    scores, tier = cache.rank("u", h, cands)
    assert tier == "device" and np.array_equal(scores, store.rank_full(h, cands))
    longer = grow(h, rng, 3)  # within max_suffix_len: ranked from the slot plus the suffix
    scores, tier = cache.rank("u", longer, cands)
    assert tier == "device" and np.array_equal(scores, store.rank_full(longer, cands))
    for field in ("item_ids", "action_ids", "timestamps"):
        arr = getattr(h, field).copy()
        arr[5] += 1
        changed = History(**{**h.__dict__, field: arr})
        assert cache.rank("u", changed, cands) is None, field
    assert cache.rank("other-user", h, cands) is None
    assert cache.rank("u", History(**{**h.__dict__, "user_features": np.array([2, 2], np.int32)}), cands) is None


def test_partial_hit_extends_only_the_new_events_and_rekeys():
    cache, store, _ = build()
    rng = np.random.default_rng(1)
    h = make_history(rng, 20)
    cache.prefill("u", h)
    longer = grow(h, rng, 8)  # more than max_suffix_len (4), within max_extend_len (10)
    scores, tier = cache.rank("u", longer, [7])
    assert tier == "partial" and np.array_equal(scores, store.rank_full(longer, [7]))
    assert cache.extended_tokens == 8
    assert cache.rank("u", longer, [7])[1] == "device"  # the entry now caches the longer prefix
    too_long = grow(longer, rng, 11)
    assert cache.rank("u", too_long, [7]) is None  # beyond max_extend_len: recompute


def test_eviction_spills_and_a_later_rank_reloads_into_a_free_slot():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(2)
    a, b = make_history(rng, 10), make_history(rng, 12)
    cache.prefill("a", a)
    cache.prefill("b", b)  # evicts a (LRU) -> spilled to DRAM
    assert store.calls.count("export") == 1 and cache.spills == 1
    scores, tier = cache.rank("a", a, [1, 2])  # reload a, evicting b (spilled too)
    assert tier == "dram" and np.array_equal(scores, store.rank_full(a, [1, 2]))
    assert store.calls.count("import") == 1
    assert cache.rank("a", a, [1])[1] == "device"
    assert cache.stats()["tiers"] == {"dram": 1, "device": 1} and cache.stats()["spills"] == 2


def test_promote_reloads_a_dram_copy_ahead_of_the_rank_without_counting_a_lookup():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(12)
    a, b = make_history(rng, 10), make_history(rng, 12)
    cache.prefill("a", a)
    cache.prefill("b", b)  # a -> DRAM
    assert cache.locate("a", a)[0] == "dram"
    assert cache.promote("a", grow(a, rng, 2))  # a prefix of the grown history is what the rank will use
    assert store.calls.count("import") == 1 and cache.promotions == 1
    assert cache.locate("a", a)[0] == "device" and cache.locate("b", b)[0] == "dram"
    assert cache.stats()["tiers"] == {} and cache.stats()["promotions"] == 1
    assert not cache.promote("a", a)  # already on the device: nothing to copy
    assert not cache.promote("c", a) and not cache.promote("a", make_history(rng, 10))  # nothing cached: R2
    scores, tier = cache.rank("a", a, [1, 2])
    assert tier == "device" and np.array_equal(scores, store.rank_full(a, [1, 2]))
    assert store.calls.count("import") == 1


def test_a_stepped_promotion_reads_as_in_flight_until_its_last_step():
    cache, store, _ = build(num_slots=2)
    rng = np.random.default_rng(13)
    a, b, c = make_history(rng, 10), make_history(rng, 12), make_history(rng, 8)
    for user, h in (("a", a), ("b", b), ("c", c)):
        cache.prefill(user, h)  # a -> DRAM
    steps = cache.promote_steps("a", a)
    assert next(steps) == SPILLED and cache.spills == 2  # making room spilled b: a step of its own
    assert cache.locate("b", b)[0] == "dram"
    assert next(steps) == 1  # first of the fake store's two copy steps
    assert cache.locate("a", a)[0] == "inflight"
    assert cache.rank("a", a, [1]) is None  # nobody uses (or reloads) a half-written slot
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value is True and cache.promotions == 1
    assert cache.locate("a", a)[0] == "device" and cache.stats()["dram"]["reloads"] == 1
    assert store.calls.count("import") == 1


def test_a_promotion_that_fails_midway_frees_its_slot_and_keeps_the_dram_copy():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(14)
    a, b = make_history(rng, 10), make_history(rng, 12)
    cache.prefill("a", a)
    cache.prefill("b", b)  # a -> DRAM, b -> DRAM when a takes the slot
    steps = cache.promote_steps("a", a)
    next(steps)
    with pytest.raises(RuntimeError):
        steps.throw(RuntimeError("copy failed"))
    assert cache.locate("a", a)[0] == "dram" and cache.promotions == 0
    assert cache.promote("a", a) and cache.locate("a", a)[0] == "device"


@pytest.mark.parametrize(("policy", "used", "spilled"), [("never", True, 0), ("used", False, 0), ("used", True, 1)])
def test_spill_policy(policy, used, spilled):
    cache, store, _ = build(num_slots=1, spill_policy=policy)
    rng = np.random.default_rng(3)
    a = make_history(rng, 10)
    cache.prefill("a", a)
    if used:
        cache.rank("a", a, [1])
    cache.prefill("b", make_history(rng, 10))
    assert store.calls.count("export") == spilled


def test_no_reload_when_recompute_is_cheaper():
    cache, store, _ = build(num_slots=1, reload_is_cheaper=lambda nbytes, n: n > 50)
    rng = np.random.default_rng(4)
    a = make_history(rng, 10)
    cache.prefill("a", a)
    cache.prefill("b", make_history(rng, 10))
    assert cache.rank("a", a, [1]) is None and "import" not in store.calls


def test_inflight_prefill_is_reported_not_served():
    cache, _, _ = build()
    h = make_history(np.random.default_rng(5), 10)
    lease = cache.reserve("u", h)
    assert cache.locate("u", h) == ("inflight", lease.key)
    assert cache.rank("u", h, [1]) is None
    assert cache.reserve("u", h) is None  # one prefill per key
    cache.abort(lease)
    assert cache.locate("u", h) == ("miss", None)


def test_full_pool_of_pinned_entries_means_recompute():
    cache, _, _ = build(num_slots=1)
    rng = np.random.default_rng(6)
    a = make_history(rng, 10)
    cache.prefill("a", a)
    hit = cache.acquire("a", a)
    assert cache.prefill("b", make_history(rng, 10)) is None  # the only slot is pinned
    cache.release(hit)
    assert cache.prefill("b", make_history(rng, 10)) is not None


class HierarchyMachine(RuleBasedStateMachine):
    """Random pre-infers, ranks (exact / grown / changed histories), evictions and time: every
    cache-served score equals the full path, and no budget is ever exceeded."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.cache, self.store, _ = build(num_slots=3, clock=self.clock)
        self.rng = np.random.default_rng(0)
        self.histories: dict[str, History] = {}

    @rule(user=st.sampled_from("abcde"), n=st.integers(1, 40))
    def preinfer(self, user, n):
        self.histories[user] = make_history(self.rng, n)
        self.cache.prefill(user, self.histories[user])

    @rule(user=st.sampled_from("abcde"), change=st.sampled_from(["same", "grow", "grow_more", "edit"]))
    def rank(self, user, change):
        h = self.histories.get(user)
        if h is None:
            return
        if change.startswith("grow"):
            h = grow(h, self.rng, 3 if change == "grow" else 9)
        elif change == "edit":
            items = h.item_ids.copy()
            items[self.rng.integers(len(items))] += 1
            h = History(items, h.action_ids, h.timestamps, h.user_features)
        cands = self.rng.integers(1, 50, 3)
        got = self.cache.rank(user, h, cands)
        if got is not None:
            assert np.array_equal(got[0], self.store.rank_full(h, cands)), got[1]
        if change == "edit":
            assert got is None or len(h) > 0 and got[1] in ("device", "dram", "partial")

    @rule()
    def evict(self):
        self.cache.manager.evict_one()

    @rule(seconds=st.floats(0.1, 100.0))
    def advance(self, seconds):
        self.clock.now += seconds

    @invariant()
    def budgets_hold(self):
        assert self.cache.manager.bytes_in_use() <= 3 * SLOT_BYTES
        assert self.cache.expander.bytes_in_use() <= 50_000


TestHierarchyMachine = HierarchyMachine.TestCase
TestHierarchyMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
