"""RelayCache: tiers, extension, spill/reload and R2, on a fake store and on the real tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from mindspore_relaygr.cache import DRAMExpander, KVCacheManager
from mindspore_relaygr.cache.hierarchy import SPILLED, RelayCache
from mindspore_relaygr.history import History
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


MAX_SUFFIX, MAX_EXTEND = 4, 10  # the engine's policy stand-in (it decides by the latency model)


def build(num_slots=2, dram=True, spill_policy="always", clock=None, **kw):
    clock = clock or Clock()
    store = FakeStore(num_slots)
    manager = KVCacheManager(num_slots, SLOT_BYTES, lifetime_ms=1000.0, clock=clock)
    expander = DRAMExpander(50_000, ttl_s=60.0, spill_policy=spill_policy, clock=clock) if dram else None
    opts = {"max_prefix_len": 60, **kw}
    return RelayCache(store, manager, expander, model_version="v1", **opts), store, clock


def drain(steps):
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


def prefill(cache, user, h):
    """What the engine's prefill relay does: reserve, write, commit (None: no slot)."""
    lease = cache.reserve(user, h)
    if lease is None:
        return None
    cache.store.prefill(lease.slot, h)
    cache.commit(lease, h)
    return lease.key


def rank(cache, user, h, cands, max_suffix=MAX_SUFFIX, max_extend=MAX_EXTEND):
    """What the engine's rank does with the cache: (scores, tier) or None on a miss."""
    hit = cache.acquire(user, h)
    if hit is None:
        return None
    tier = hit.tier
    if len(h) - hit.prefix_len > max_suffix:
        if len(h) - hit.prefix_len > max_extend:
            cache.release(hit)
            return None
        hit = drain(cache.extend_steps(hit, h, max_extend))
        if hit is None:
            return None
        tier = "partial"
    try:
        return cache.store.rank_cached(hit.slot, hit.prefix_len, h.slice(hit.prefix_len), cands), tier
    finally:
        cache.release(hit)


def promote(cache, user, h):
    tier, key = cache.locate(user, h)
    return tier == "dram" and drain(cache.promote_steps(key))


def test_device_hit_then_suffix_then_miss_on_any_change():
    cache, store, _ = build()
    rng = np.random.default_rng(0)
    h = make_history(rng, 20)
    assert prefill(cache, "u", h) is not None
    cands = [1, 2, 3]
    scores, tier = rank(cache, "u", h, cands)
    assert tier == "device" and np.array_equal(scores, store.rank_full(h, cands))
    longer = grow(h, rng, 3)  # within max_suffix_len: ranked from the slot plus the suffix
    scores, tier = rank(cache, "u", longer, cands)
    assert tier == "device" and np.array_equal(scores, store.rank_full(longer, cands))
    for field in ("item_ids", "action_ids", "timestamps"):
        arr = getattr(h, field).copy()
        arr[5] += 1
        changed = History(**{**h.__dict__, field: arr})
        assert rank(cache, "u", changed, cands) is None, field
    assert rank(cache, "other-user", h, cands) is None
    assert rank(cache, "u", History(**{**h.__dict__, "user_features": np.array([2, 2], np.int32)}), cands) is None


def test_partial_hit_extends_only_the_new_events_and_rekeys():
    cache, store, _ = build()
    rng = np.random.default_rng(1)
    h = make_history(rng, 20)
    prefill(cache, "u", h)
    longer = grow(h, rng, 8)  # more than MAX_SUFFIX (4), within MAX_EXTEND (10)
    scores, tier = rank(cache, "u", longer, [7])
    assert tier == "partial" and np.array_equal(scores, store.rank_full(longer, [7]))
    assert cache.extended_tokens == 8
    assert rank(cache, "u", longer, [7])[1] == "device"  # the entry now caches the longer prefix
    too_long = grow(longer, rng, 11)
    assert rank(cache, "u", too_long, [7]) is None  # beyond MAX_EXTEND: recompute


def test_eviction_spills_and_a_later_rank_reloads_into_a_free_slot():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(2)
    a, b = make_history(rng, 10), make_history(rng, 12)
    prefill(cache, "a", a)
    prefill(cache, "b", b)  # evicts a (LRU) -> spilled to DRAM
    assert store.calls.count("export") == 1 and cache.spills == 1
    scores, tier = rank(cache, "a", a, [1, 2])  # reload a, evicting b (spilled too)
    assert tier == "dram" and np.array_equal(scores, store.rank_full(a, [1, 2]))
    assert store.calls.count("import") == 1
    assert rank(cache, "a", a, [1])[1] == "device"
    assert cache.stats().spills == 2 and cache.stats().dram.hits == 1  # one reload, one DRAM hit


def test_promote_reloads_a_dram_copy_ahead_of_the_rank_without_counting_a_lookup():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(12)
    a, b = make_history(rng, 10), make_history(rng, 12)
    prefill(cache, "a", a)
    prefill(cache, "b", b)  # a -> DRAM
    assert cache.locate("a", a)[0] == "dram"
    assert promote(cache, "a", grow(a, rng, 2))  # a prefix of the grown history is what the rank will use
    assert store.calls.count("import") == 1 and cache.promotions == 1
    assert cache.locate("a", a)[0] == "device" and cache.locate("b", b)[0] == "dram"
    assert cache.stats().promotions == 1 and cache.stats().dram.hits == 0  # a promotion is not a lookup
    assert not promote(cache, "a", a)  # already on the device: nothing to copy
    assert not promote(cache, "c", a) and not promote(cache, "a", make_history(rng, 10))  # nothing cached: R2
    scores, tier = rank(cache, "a", a, [1, 2])
    assert tier == "device" and np.array_equal(scores, store.rank_full(a, [1, 2]))
    assert store.calls.count("import") == 1


def test_a_stepped_promotion_reads_as_in_flight_until_its_last_step():
    cache, store, _ = build(num_slots=2)
    rng = np.random.default_rng(13)
    a, b, c = make_history(rng, 10), make_history(rng, 12), make_history(rng, 8)
    for user, h in (("a", a), ("b", b), ("c", c)):
        prefill(cache, user, h)  # a -> DRAM
    steps = cache.promote_steps(cache.locate("a", a)[1])
    assert next(steps) == SPILLED and cache.spills == 2  # making room spilled b: a step of its own
    assert cache.locate("b", b)[0] == "dram"
    assert next(steps) == 1  # first of the fake store's two copy steps
    assert cache.locate("a", a)[0] == "inflight"
    assert rank(cache, "a", a, [1]) is None  # nobody uses (or reloads) a half-written slot
    with pytest.raises(StopIteration) as done:
        next(steps)
    assert done.value.value is True and cache.promotions == 1
    assert cache.locate("a", a)[0] == "device" and cache.stats().dram.reloads == 1
    assert store.calls.count("import") == 1


def test_a_promotion_that_fails_midway_frees_its_slot_and_keeps_the_dram_copy():
    cache, store, _ = build(num_slots=1)
    rng = np.random.default_rng(14)
    a, b = make_history(rng, 10), make_history(rng, 12)
    prefill(cache, "a", a)
    prefill(cache, "b", b)  # a -> DRAM, b -> DRAM when a takes the slot
    steps = cache.promote_steps(cache.locate("a", a)[1])
    next(steps)
    with pytest.raises(RuntimeError):
        steps.throw(RuntimeError("copy failed"))
    assert cache.locate("a", a)[0] == "dram" and cache.promotions == 0
    assert promote(cache, "a", a) and cache.locate("a", a)[0] == "device"


@pytest.mark.parametrize(("policy", "used", "spilled"), [("never", True, 0), ("used", False, 0), ("used", True, 1)])
def test_spill_policy(policy, used, spilled):
    cache, store, _ = build(num_slots=1, spill_policy=policy)
    rng = np.random.default_rng(3)
    a = make_history(rng, 10)
    prefill(cache, "a", a)
    if used:
        rank(cache, "a", a, [1])
    prefill(cache, "b", make_history(rng, 10))
    assert store.calls.count("export") == spilled


def test_no_reload_when_recompute_is_cheaper():
    cache, store, _ = build(num_slots=1, reload_is_cheaper=lambda nbytes, n: n > 50)
    rng = np.random.default_rng(4)
    a = make_history(rng, 10)
    prefill(cache, "a", a)
    prefill(cache, "b", make_history(rng, 10))
    assert rank(cache, "a", a, [1]) is None and "import" not in store.calls


def test_inflight_prefill_is_reported_not_served():
    cache, _, _ = build()
    h = make_history(np.random.default_rng(5), 10)
    lease = cache.reserve("u", h)
    assert cache.locate("u", h) == ("inflight", lease.key)
    assert rank(cache, "u", h, [1]) is None
    assert cache.reserve("u", h) is None  # one prefill per key
    cache.abort(lease)
    assert cache.locate("u", h) == ("miss", None)


def test_full_pool_of_pinned_entries_means_recompute():
    cache, _, _ = build(num_slots=1)
    rng = np.random.default_rng(6)
    a = make_history(rng, 10)
    prefill(cache, "a", a)
    hit = cache.acquire("a", a)
    assert prefill(cache, "b", make_history(rng, 10)) is None  # the only slot is pinned
    cache.release(hit)
    assert prefill(cache, "b", make_history(rng, 10)) is not None


def test_flush_empties_the_dram_tier_including_older_copies():
    """Defect 2: flush left the DRAM copies of a user's older prefixes behind."""
    cache, _, _ = build(num_slots=1)
    rng = np.random.default_rng(20)
    a1 = make_history(rng, 10)
    prefill(cache, "a", a1)
    prefill(cache, "b", make_history(rng, 10))  # a1 -> DRAM
    prefill(cache, "a", make_history(rng, 12))  # a's newest prefix (not an extension of a1); b -> DRAM
    assert cache.expander.stats().num_entries == 2
    cache.flush()
    assert cache.expander.stats().num_entries == 0 and cache.manager.stats().num_ready == 0
    assert cache.locate("a", a1) == ("miss", None)


def test_another_history_under_a_users_id_never_drops_their_entries():
    """Defect 3: committing any other history for a user released their resident prefix."""
    cache, store, _ = build(num_slots=3)
    rng = np.random.default_rng(21)
    mine, forged = make_history(rng, 20), make_history(rng, 25)
    prefill(cache, "u", mine)
    prefill(cache, "u", forged)  # sent by someone else under u's id
    assert cache.locate("u", mine)[0] == "device" and cache.superseded == 0
    scores, tier = rank(cache, "u", mine, [1, 2])
    assert tier == "device" and np.array_equal(scores, store.rank_full(mine, [1, 2]))


def test_the_same_users_longer_history_supersedes_the_prefixes_it_extends():
    cache, _, _ = build(num_slots=3)
    rng = np.random.default_rng(22)
    h = make_history(rng, 20)
    longer = grow(h, rng, 15)
    prefill(cache, "u", h)
    prefill(cache, "u", longer)
    assert cache.superseded == 1 and cache.manager.keys_of("u") == [cache.key_for("u", longer)]
    assert cache.locate("u", h) == ("miss", None) and cache.locate("u", longer)[0] == "device"
    assert "export" not in cache.store.calls  # a superseded entry is not spilled to DRAM


def test_locate_picks_the_longest_cached_prefix_across_tiers():
    cache, _, _ = build(num_slots=1)
    rng = np.random.default_rng(23)
    h = make_history(rng, 10)
    longer = grow(h, rng, 5)
    prefill(cache, "u", longer)
    prefill(cache, "v", make_history(rng, 10))  # longer -> DRAM
    prefill(cache, "u", h)  # does not supersede the longer DRAM copy
    assert cache.locate("u", grow(longer, rng, 2)) == ("dram", cache.key_for("u", longer))
    assert cache.locate("u", grow(h, rng, 2)) == ("device", cache.key_for("u", h))


def test_kept_keys_are_evicted_last_never_superseded_nor_reopened_and_drops_are_reported():
    """The caller's `keep` (prefixes whose rank may still come) is honoured by every path that frees a
    slot or rewrites an entry, and every READY entry the cache drops is listed once by take_dropped."""
    cache, _, clock = build(num_slots=2)
    rng = np.random.default_rng(3)
    a = make_history(rng, 20)
    a_key = prefill(cache, "a", a)
    clock.now = 0.1
    b_key = prefill(cache, "b", make_history(rng, 20))
    keep = {a_key}
    lease = cache.reserve("c", make_history(rng, 20), keep=keep)  # a is the LRU entry, but kept
    assert lease is not None and cache.manager.peek(a_key) is not None and cache.manager.peek(b_key) is None
    assert cache.take_dropped() == [b_key] and cache.take_dropped() == []
    assert cache.expander.contains(b_key)  # spilled on its way out (policy "always")
    cache.abort(lease)

    longer = grow(a, rng, 8)
    assert cache.reopen(a_key, longer, keep=keep) is None  # a's rank may carry the 20 events
    lease = cache.reserve("a", longer, keep=keep)
    cache.store.prefill(lease.slot, longer)
    cache.commit(lease, longer, keep=keep)
    assert cache.manager.peek(a_key) is not None and cache.superseded == 0  # kept beside the longer one
    assert cache.take_dropped() == []

    cache.drop(lease.key, "test")  # once nobody waits for a's 20 events, a longer history supersedes them
    assert cache.take_dropped() == [lease.key]
    lease = cache.reserve("a", longer)
    cache.store.prefill(lease.slot, longer)
    cache.commit(lease, longer)
    assert cache.manager.peek(a_key) is None and cache.superseded == 1
    assert cache.take_dropped() == [a_key]
