"""RelayEngine over the numpy FakeModel (no MindSpore): metrics per tier, users' entries, threads,
the copy bandwidth, flush. Real engine, ledger, trigger and cache tiers; fake graphs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.relay import calibrate
from mindspore_relaygr.relay.engine import RelayEngine
from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint
from tests.conftest import CONFIGS, random_history
from tests.relay.fake_model import FakeModel
from tests.waiting import wait_until

BASE = ["relay.warmup=false", "trigger.slo_ms=50", "trigger.prefill_chunk_len=32", "cache.num_slots=4",
        "expander.copy_bytes_per_s=1.0e+9"]
CANDS = np.arange(1, 11)


def latency(full_ms: float = 200.0, prefill_ms: float = 20.0) -> LatencyModel:
    return LatencyModel([LatencyPoint("full", 128, 32, 0, full_ms), LatencyPoint("relay", 128, 16, 32, 5.0),
                         LatencyPoint("prefill", 128, 0, 0, prefill_ms)])


@pytest.fixture
def make_engine():
    engines = []

    def make(*overrides, prefill_ms=20.0):
        cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, *overrides])
        eng = RelayEngine(cfg, FakeModel(cfg), latency(prefill_ms=prefill_ms))
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def hist(seed, n=60):
    return random_history(np.random.default_rng(seed), n, user_features=[1, 2])


def first(h, n):
    """The first n events of history h (the user's features kept)."""
    return {k: (v if k == "user_features" else v[:n]) for k, v in h.items()}


def relay(eng, user, h):
    assert eng.preinfer(user, h, num_candidates=10).admitted
    eng.wait_prefills(10)


def test_each_rank_counts_once_in_the_tier_that_served_it(make_engine):
    """Defect 1: misses were never counted and a DRAM-served rank counted two DRAM hits."""
    eng = make_engine("expander.enable_prefetch=false")
    users = {f"p{i}": hist(i) for i in range(5)}  # one more user than the 4 slots
    for user, h in users.items():
        relay(eng, user, h)
        assert eng.rank(user, h, CANDS).cache == "device"
    assert eng.rank("p0", users["p0"], CANDS).cache == "dram"  # evicted to DRAM, reloaded
    assert eng.rank("nobody", hist(99), CANDS).cache == "miss"
    stats = eng.stats()
    assert (stats.ranks.device, stats.ranks.dram, stats.ranks.miss) == (5, 1, 1)
    assert (stats.ranks.device_misses, stats.cache.dram.hits, stats.cache.dram.reloads) == (2, 1, 1)
    assert (stats.relays.consumed, stats.relays.inflight_relays) == (5, 0)


def test_a_forged_history_under_a_users_id_neither_drops_nor_hides_their_prefix(make_engine):
    """Defect 3: a valid pre-infer under another user's id released their entry and overwrote their
    pending prefill, so their next rank missed."""
    eng = make_engine("relay.inflight_wait_ms=5000")
    mine, forged = hist(1), hist(2, 80)
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))  # both prefills stay queued
    assert eng.preinfer("u", mine, num_candidates=10).admitted
    assert eng.preinfer("u", forged, num_candidates=10).admitted  # someone else, under u's id
    assert eng.ledger.footprint().pending == 2
    ranked = []
    ranker = threading.Thread(target=lambda: ranked.append(eng.rank("u", mine, CANDS)))
    ranker.start()
    wait_until(lambda: eng.stats().work.inflight_boosts, what="the rank to find u's prefill pending")
    gate.set()
    ranker.join(10)
    res = ranked[0]
    assert res.cache == "inflight"  # waited for u's own prefill, not the forged one
    assert eng.rank("u", mine, CANDS).cache == "device"
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(mine, CANDS))
    assert eng.stats().cache.superseded == 0


def test_a_longer_history_of_the_same_user_supersedes_the_prefix_it_extends(make_engine):
    eng = make_engine("cache.enable_extension=false")
    full = hist(3, 110)
    short = first(full, 40)
    relay(eng, "u", short)
    assert eng.rank("u", short, CANDS).cache == "device"  # its rank came: nobody waits for it any more
    relay(eng, "u", full)  # 70 more events: a new prefill
    stats = eng.stats()
    assert stats.cache.superseded == 1 and stats.relays.consumed == 1
    assert stats.cache.device.num_ready == 1 and stats.cache.dram.num_entries == 0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def clocked_engine(*overrides):
    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "relay.ready_ttl_ms=1000", *overrides])
    clock = Clock()
    return RelayEngine(cfg, FakeModel(cfg), latency(), clock=clock), clock


def test_orphan_preinfers_expire_and_the_relay_recovers_without_a_flush():
    """Pre-infers whose rank never comes (10x the slots) held the trigger's footprint for ever: every
    later pre-infer was refused `footprint` and every rank missed until a flush."""
    eng, clock = clocked_engine()
    try:
        for i in range(10 * eng.model.num_slots):
            eng.preinfer(f"gone{i}", hist(100 + i), num_candidates=10)  # the user left after retrieval
            eng.wait_prefills(10)
        assert eng.preinfer("new", hist(7), num_candidates=10).reason == "footprint"  # inside the TTL
        clock.now += 1.001  # one relay.ready_ttl_ms later
        assert eng.preinfer("new", hist(7), num_candidates=10).admitted
        eng.wait_prefills(10)
        res = eng.rank("new", hist(7), CANDS)
        assert res.cache == "device"
        np.testing.assert_array_equal(res.scores, eng.model.rank_full(hist(7), CANDS))
        stats = eng.stats()
        assert stats.relays.expired == eng.model.num_slots and stats.relays.inflight_relays == 0
        assert stats.relays.dropped_evicted == 0  # expired orphans gave their slots up, no awaited one went
    finally:
        eng.close()


def test_eviction_spares_a_ready_relay_whose_rank_has_not_come():
    """A READY relay awaiting its rank was evicted (a wasted prefill) while consumed entries were there."""
    eng, clock = clocked_engine("expander.enable_prefetch=false")
    try:
        relay(eng, "waiting", hist(1))  # the least recently used entry, but its rank is still to come
        for i in range(3):
            clock.now += 0.01
            relay(eng, f"done{i}", hist(10 + i))
            assert eng.rank(f"done{i}", hist(10 + i), CANDS).cache == "device"
        relay(eng, "next", hist(20))  # the pool is full: one entry must go
        assert eng.rank("waiting", hist(1), CANDS).cache == "device"
        stats = eng.stats()
        assert stats.relays.dropped_evicted == 0 and stats.cache.device.evictions_kept == 0
        assert eng.rank("done0", hist(10), CANDS).cache == "dram"  # the consumed LRU entry went instead
    finally:
        eng.close()


@pytest.mark.parametrize("sender", ["someone else", "the user, history grown"])
def test_a_preinfer_does_not_rewrite_a_prefix_whose_rank_may_still_come(make_engine, sender):
    """A pre-infer under A's id (A's real prefix + invented events, or A's own newer pre-infer racing
    A's rank) was admitted as an in-place extension of A's cached prefix: A's next rank missed."""
    eng = make_engine()
    grown = hist(5, 110)  # A's real history, 70 events on from A's pre-infer
    a_prefix = first(grown, 40)
    if sender == "someone else":
        invented = hist(6, 110)
        grown = {k: (v if k == "user_features" else np.r_[a_prefix[k], invented[k][40:]]) for k, v in a_prefix.items()}
        grown["timestamps"] = np.r_[a_prefix["timestamps"], a_prefix["timestamps"][-1] + np.arange(1, 71)]
    relay(eng, "A", a_prefix)
    relay(eng, "A", grown)  # not an extension of A's awaited prefix: a prefill of its own
    a_rank = first(hist(5, 110), 48)  # A's rank carries the history A's pre-infer had, plus 8 events
    res = eng.rank("A", a_rank, CANDS)
    assert res.cache == "device"
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(a_rank, CANDS))
    assert eng.rank("A", grown, CANDS).cache == "device"  # and the other history is cached too
    assert eng.stats().work.extensions == 0


def test_preinfer_calls_only_the_caches_thread_safe_methods_off_the_device_thread(make_engine):
    """Defect 4: RelayCache is device-thread-only except for its THREAD_SAFE methods."""
    eng = make_engine()
    device_thread = eng.executor.submit(threading.current_thread).result()
    off_thread: set[str] = set()
    cache_type = type(eng.cache)
    for name in [n for n in vars(cache_type) if callable(getattr(cache_type, n)) and not n.startswith("__")]:
        original = getattr(eng.cache, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            if threading.current_thread() is not device_thread:
                off_thread.add(_name)
            return _original(*args, **kwargs)

        setattr(eng.cache, name, spy)
    h = hist(4)
    relay(eng, "u", h)
    eng.preinfer("u", h)
    eng.predicted_rank_ms("u", h, CANDS)
    eng.rank("u", h, CANDS)
    assert off_thread and off_thread <= cache_type.THREAD_SAFE


def test_a_ranks_predicted_time_follows_where_its_prefix_is(make_engine):
    """Admission control weighs a rank by this: a miss costs the full path, a resident prefix the relay
    path, a grown history its extension too; never more than the miss."""
    eng = make_engine()
    lat = eng.latency
    h = hist(5, 60)
    miss = lat.predict_full_ms(61, 10)  # 60 events and the user token
    assert eng.predicted_rank_ms("u", h, CANDS) == miss == 200.0
    relay(eng, "u", first(h, 50))
    assert eng.predicted_rank_ms("u", h, CANDS) == lat.predict_relay_ms(51, 10, 10) == 5.0  # 10 new events
    assert eng.predicted_rank_ms("someone else", h, CANDS) == miss
    grown = hist(5, 100)
    grown = {k: (v if k == "user_features" else np.concatenate([h[k][:50], v[50:]])) for k, v in grown.items()}
    extension = sum(eng._predicted_extension_ms(eng.cache.locate("u", validate(eng, grown))[1], "device", 100))
    assert eng.predicted_rank_ms("u", grown, CANDS) == pytest.approx(extension + lat.predict_relay_ms(101, 0, 10))
    assert eng.predicted_rank_ms("u", grown, CANDS) < lat.predict_full_ms(101, 10)
    fixed = make_engine("cache.enable_extension=false")
    relay(fixed, "u", first(h, 50))
    assert fixed.predicted_rank_ms("u", grown, CANDS) == lat.predict_full_ms(101, 10)  # it would miss
    bypass = make_engine("relay.enabled=false", "relay.max_online_len=40")
    assert bypass.predicted_rank_ms("u", h, CANDS) == lat.predict_full_ms(41, 10)
    with pytest.raises(ValueError):
        eng.predicted_rank_ms("u", h, [0])  # the rank's own validation
    eng.latency = LatencyModel([p for p in lat.points if p.kind != "relay"])  # a profile without relay graphs
    assert eng.predicted_rank_ms("u", h, CANDS) == miss


def test_a_null_copy_bandwidth_is_measured_at_start_up_and_decides_reloads(make_engine, monkeypatch):
    """Defect 5: copy_bytes_per_s: null meant a hard-coded 1 GB/s."""
    monkeypatch.setattr(calibrate, "measure_copy_bytes_per_s", lambda model, chunk: 1.0)  # 1 byte/s
    eng = make_engine("expander.copy_bytes_per_s=null", "expander.enable_prefetch=false")
    assert eng.stats().copy_bytes_per_s == 1.0
    users = {f"p{i}": hist(10 + i) for i in range(5)}
    for user, h in users.items():
        relay(eng, user, h)
        eng.rank(user, h, CANDS)
    assert eng.cache.locate("p0", validate(eng, users["p0"]))[0] == "dram"
    assert eng.rank("p0", users["p0"], CANDS).cache == "miss"  # recomputing beats a 1 byte/s copy


def validate(eng, h):
    from mindspore_relaygr.model.inputs import validate_history

    return validate_history(eng.config.model, h)


def test_flush_empties_both_tiers(make_engine):
    eng = make_engine("expander.enable_prefetch=false")
    for i in range(6):
        relay(eng, f"f{i}", hist(30 + i))
        eng.rank(f"f{i}", hist(30 + i), CANDS)
    assert eng.stats().cache.dram.num_entries == 2
    eng.flush()
    stats = eng.stats()
    assert stats.cache.dram.num_entries == 0 and stats.cache.device.num_ready == 0


# ---------------------------------------------------------------- extension across requests (defect 6)


def test_a_preinfer_whose_history_grew_extends_the_resident_prefix_by_only_the_new_events(make_engine):
    """Defect 6: a history grown by more than the suffix was prefilled afresh (all 100 events again)."""
    eng = make_engine()
    full = hist(20, 100)
    relay(eng, "u", first(full, 40))
    assert eng.rank("u", first(full, 40), CANDS).cache == "device"
    before = eng.model.events_computed
    decision = eng.preinfer("u", full, num_candidates=10)  # 60 new events > the 16-event suffix
    assert decision.admitted
    eng.wait_prefills(10)
    assert eng.model.events_computed - before == 60
    stats = eng.stats()
    assert (stats.work.prefills, stats.work.extensions, stats.work.extension_chunks) == (1, 1, 2)  # 32 + 28
    assert stats.cache.extended_tokens == 60 and stats.cache.device.num_ready == 1
    res = eng.rank("u", full, CANDS)
    assert res.cache == "device"
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(full, CANDS))
    assert eng.stats().relays.consumed == 2


def test_a_dram_prefix_is_brought_back_and_extended(make_engine):
    eng = make_engine("expander.enable_prefetch=false")
    grown = hist(21, 90)
    relay(eng, "u", first(grown, 50))
    eng.rank("u", first(grown, 50), CANDS)
    for i in range(4):  # four other users push u's slot to DRAM
        relay(eng, f"o{i}", hist(30 + i))
    assert eng.cache.locate("u", validate(eng, first(grown, 50)))[0] == "dram"
    before = eng.model.events_computed
    assert eng.preinfer("u", grown, num_candidates=10).admitted
    eng.wait_prefills(10)
    assert eng.model.events_computed - before == 40
    assert eng.stats().work.extensions == 1 and eng.stats().cache.dram.reloads == 1
    res = eng.rank("u", grown, CANDS)
    assert res.cache == "device"
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(grown, CANDS))


def test_a_rank_whose_history_grew_extends_in_place_when_that_beats_a_miss(make_engine):
    eng = make_engine()
    full = hist(22, 100)
    relay(eng, "u", first(full, 30))
    before = eng.model.events_computed
    res = eng.rank("u", full, CANDS)  # no pre-infer of the grown history
    assert res.cache == "partial" and eng.model.events_computed - before == 70
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(full, CANDS))
    assert (eng.stats().work.extensions, eng.stats().work.extension_chunks) == (1, 3)
    assert eng.rank("u", full, CANDS).cache == "device"


def test_without_extension_a_grown_history_is_prefilled_afresh_or_missed(make_engine):
    eng = make_engine("cache.enable_extension=false")
    full = hist(23, 100)
    relay(eng, "u", first(full, 30))
    assert eng.rank("u", full, CANDS).cache == "miss"
    before = eng.model.events_computed
    relay(eng, "u", full)
    assert eng.model.events_computed - before == 100 and eng.stats().work.extensions == 0


def test_a_fresh_prefill_is_chosen_when_the_copy_back_costs_more(make_engine, monkeypatch):
    monkeypatch.setattr(calibrate, "measure_copy_bytes_per_s", lambda model, chunk: 1.0)  # 1 byte/s
    eng = make_engine("expander.copy_bytes_per_s=null", "expander.enable_prefetch=false")
    grown = hist(24, 90)
    relay(eng, "u", first(grown, 50))
    eng.rank("u", first(grown, 50), CANDS)
    for i in range(4):
        relay(eng, f"o{i}", hist(40 + i))
        eng.rank(f"o{i}", hist(40 + i), CANDS)  # consumed: the trigger's footprint stays small
    assert eng.cache.locate("u", validate(eng, grown))[0] == "dram"
    before = eng.model.events_computed
    relay(eng, "u", grown)
    assert eng.model.events_computed - before == 90 and eng.stats().work.extensions == 0


def test_a_rank_during_an_extension_waits_for_it(make_engine):
    eng = make_engine("relay.inflight_wait_ms=5000")
    full = hist(25, 100)
    relay(eng, "u", first(full, 40))
    eng.rank("u", first(full, 40), CANDS)  # consumed: the returning user's prefix may be extended in place
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))
    assert eng.preinfer("u", full, num_candidates=10).admitted  # the extension is queued behind the gate
    assert eng.cache.locate("u", validate(eng, full))[0] == "device"  # still the 40-event prefix
    ranked = []
    ranker = threading.Thread(target=lambda: ranked.append(eng.rank("u", full, CANDS)))
    ranker.start()
    wait_until(lambda: eng.stats().work.inflight_boosts, what="the rank to boost the extension")
    gate.set()
    ranker.join(10)
    assert ranked[0].cache == "inflight" and eng.stats().work.extensions == 1
    np.testing.assert_array_equal(ranked[0].scores, eng.model.rank_full(full, CANDS))
