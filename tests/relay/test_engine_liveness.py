"""Liveness of the relay engine (numpy FakeModel, injected clock): pre-infers whose rank never comes, prefills
that raise and relays that find no slot leave nothing behind, and the relay keeps working after them.

"Nothing behind" is checked through the engine's public state: no live relay in the ledger, a footprint of
zero, no RESERVED device entry, no pinned one (a flush empties the pool), and a later pre-infer of the same
user that is admitted, prefilled and served from the device with exact scores. Events are ordered with
threading.Event hand-offs, never with sleeps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from mindspore_relaygr import load_config
from mindspore_relaygr.history import History
from mindspore_relaygr.relay.engine import RelayEngine
from mindspore_relaygr.relay.executor import RANK
from mindspore_relaygr.relay.ledger import Footprint
from tests.conftest import CONFIGS
from tests.relay.fake_model import FakeModel
from tests.relay.test_engine_fake import BASE, CANDS, Clock, first, hist, latency

TTL_S = 1.0
Hook = Callable[[int, History, int], None]


class HookedModel(FakeModel):
    """FakeModel that runs `hook(slot, history, start)` before every prefill chunk (it may block or raise)."""

    def __init__(self, config, hook: Hook | None = None) -> None:
        super().__init__(config)
        self.hook = hook

    def prefill(self, slot, history, start=0):
        if self.hook is not None:
            self.hook(slot, history, start)
        return super().prefill(slot, history, start)


@contextmanager
def engine(*overrides: str) -> Iterator[tuple[RelayEngine, Clock]]:
    """An engine over a HookedModel whose relay TTL runs on a fake clock; closed on exit."""
    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, f"relay.ready_ttl_ms={TTL_S * 1e3}", *overrides])
    clock = Clock()
    eng = RelayEngine(cfg, HookedModel(cfg), latency(), clock=clock)
    try:
        yield eng, clock
    finally:
        eng.close()


def settle(eng: RelayEngine) -> None:
    """Wait for every relay, then for the device thread to run what their futures' callbacks do (a failed
    relay is dropped by its future's done callback, which the device thread runs before its next task)."""
    eng.wait_prefills(10)
    eng.executor.submit(lambda: None).result(10)


def assert_nothing_left(eng: RelayEngine, users: list[str]) -> None:
    """No live relay, no footprint, no RESERVED entry, no pinned entry, no leftover slot content."""
    settle(eng)
    assert all(eng.ledger.of_user(u) == [] for u in users)
    assert eng.ledger.footprint() == Footprint(0, 0)
    assert eng.stats().cache.device.num_reserved == 0
    eng.flush()  # drops every READY entry that is not pinned
    device = eng.stats().cache.device
    assert (device.num_ready, device.num_free_slots) == (0, eng.model.num_slots)
    assert eng.model.slots == {}  # every freed slot was released in the model too


def assert_relayed_again(eng: RelayEngine, user: str, h: dict) -> None:
    """The user's next pre-infer is admitted and prefilled, and their rank is served from the device, exactly."""
    prefills = eng.stats().work.prefills
    assert eng.preinfer(user, h, num_candidates=10).admitted
    settle(eng)
    assert eng.stats().work.prefills == prefills + 1
    res = eng.rank(user, h, CANDS)
    assert res.cache == "device"
    np.testing.assert_array_equal(res.scores, eng.model.rank_full(h, CANDS))


def test_waves_of_orphan_preinfers_expire_and_never_switch_the_relay_off():
    """Every wave fills the footprint with pre-infers whose rank never comes; one TTL later the footprint is
    back to zero and the next wave is admitted and prefilled like the first (test_engine_fake checks one wave
    and the rank after it)."""
    with engine() as (eng, clock):
        slots = eng.model.num_slots
        for wave in range(3):
            decisions = [eng.preinfer(f"w{wave}-{i}", hist(100 * wave + i), num_candidates=10).reason
                         for i in range(slots + 2)]
            assert decisions == ["admitted"] * slots + ["footprint"] * 2
            settle(eng)
            assert eng.ledger.footprint() == Footprint(slots, 0)
            assert eng.stats().work.prefills == slots * (wave + 1)
            clock.now += TTL_S  # the users left after retrieval
            assert eng.ledger.footprint() == Footprint(0, 0) and eng.ledger.awaited() == frozenset()
        relays = eng.stats().relays
        assert (relays.admitted, relays.expired, relays.consumed) == (3 * slots, 3 * slots, 0)
        assert relays.dropped_evicted == 0  # expired orphans gave their slots up, no awaited relay was evicted
        assert_relayed_again(eng, "late", hist(7))
        assert_nothing_left(eng, [f"w{w}-{i}" for w in range(3) for i in range(slots + 2)] + ["late"])


def test_a_prefill_that_raises_is_dropped_as_failed_and_its_user_is_ranked_in_full():
    for fail_at in (0, 32):  # the first chunk, or the second (the slot half written)
        h = hist(1, 60)
        failed: list[int] = []

        def hook(slot: int, history: History, start: int, fail_at=fail_at, failed=failed) -> None:
            if start == fail_at and not failed:
                failed.append(slot)
                raise RuntimeError("device error")

        with engine() as (eng, _):
            eng.model.hook = hook
            assert eng.preinfer("u", h, num_candidates=10).admitted
            settle(eng)
            assert failed, "the hook never ran"
            stats = eng.stats()
            assert (stats.relays.dropped_failed, stats.work.prefill_errors, stats.work.prefills) == (1, 1, 0)
            assert eng.ledger.of_user("u") == [] and eng.ledger.footprint() == Footprint(0, 0)
            assert stats.cache.device.num_free_slots == eng.model.num_slots  # the reserved slot was given back
            assert failed[0] not in eng.model.slots  # and its half-written content released
            res = eng.rank("u", h, CANDS)
            assert res.cache == "miss"
            np.testing.assert_array_equal(res.scores, eng.model.rank_full(h, CANDS))
            assert_relayed_again(eng, "u", h)
            assert_nothing_left(eng, ["u"])


def boost_signal(eng: RelayEngine) -> threading.Event:
    """An Event set once a rank has boosted a relay (the engine's own call to the executor's boost)."""
    boosted = threading.Event()
    original = eng.executor.boost

    def boost(future, priority=RANK):
        done = original(future, priority)
        boosted.set()
        return done

    eng.executor.boost = boost
    return boosted


def rank_in_thread(eng: RelayEngine, user: str, h: dict) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(eng.rank(user, h, CANDS)))
    thread.start()
    return thread, out


def fail(slot: int, history: History, start: int) -> None:
    raise RuntimeError("device error")


def test_a_rank_waiting_for_a_prefill_that_raises_falls_back_to_the_full_path():
    h = hist(2, 60)
    with engine("relay.inflight_wait_ms=5000") as (eng, _):
        eng.model.hook = fail
        boosted = boost_signal(eng)
        gate = threading.Event()
        eng.executor.submit(lambda: gate.wait(10))  # the prefill stays queued until the rank waits for it
        assert eng.preinfer("u", h, num_candidates=10).admitted
        thread, out = rank_in_thread(eng, "u", h)
        assert boosted.wait(10)
        gate.set()
        thread.join(10)
        assert not thread.is_alive() and out[0].cache == "miss"
        np.testing.assert_array_equal(out[0].scores, eng.model.rank_full(h, CANDS))
        eng.model.hook = None
        assert eng.stats().relays.dropped_failed == 1
        assert_relayed_again(eng, "u", h)
        assert_nothing_left(eng, ["u"])


def test_a_prefill_that_finds_no_free_slot_is_dropped_as_no_slot():
    """One slot, held (RESERVED) by A's extension between two of its chunks, when a rank boosts B's prefill
    ahead of A's second chunk: B's relay finds no slot it may take, is dropped `no_slot`, B is ranked in full,
    and both users are relayed normally afterwards."""
    grown = hist(3, 100)
    h_b = hist(4, 60)
    with engine("cache.num_slots=1", "relay.inflight_wait_ms=5000") as (eng, _):
        assert eng.preinfer("A", first(grown, 40), num_candidates=10).admitted
        settle(eng)
        assert eng.rank("A", first(grown, 40), CANDS).cache == "device"  # consumed: A may be extended in place
        boosted, holding = boost_signal(eng), threading.Event()

        def hold_first_extension_chunk(slot: int, history: History, start: int) -> None:
            if start == 40:  # A's extension has reopened the one slot: wait for B's rank to boost B
                holding.set()
                assert boosted.wait(10)

        eng.model.hook = hold_first_extension_chunk
        assert eng.preinfer("A", grown, num_candidates=10).admitted  # 60 new events: an extension, 2 chunks
        assert eng.preinfer("B", h_b, num_candidates=10).admitted
        assert holding.wait(10)
        thread, out = rank_in_thread(eng, "B", h_b)
        thread.join(10)
        assert not thread.is_alive() and out[0].cache == "miss"
        np.testing.assert_array_equal(out[0].scores, eng.model.rank_full(h_b, CANDS))
        settle(eng)
        stats = eng.stats()
        assert (stats.relays.dropped_no_slot, stats.work.prefill_no_slot, stats.work.extensions) == (1, 1, 1)
        assert eng.ledger.of_user("B") == [] and eng.ledger.footprint() == Footprint(0, 0)
        assert eng.cache.manager.keys_of("B") == [] and stats.cache.device.num_reserved == 0
        assert eng.rank("A", grown, CANDS).cache == "device"  # A's extension went on after B's drop
        eng.model.hook = None
        assert_relayed_again(eng, "B", h_b)
        assert_nothing_left(eng, ["A", "B"])


def test_a_preinfer_longer_than_a_slot_is_refused_before_it_costs_anything():
    """A prefix no slot can hold is refused at once (`too_long`): no token-bucket debit, no relay record, no
    no_slot drop later."""
    with engine() as (eng, _):
        capacity = eng.model.layout.slot_len - 1  # events besides the user token
        whole = hist(91, capacity + 1)
        before = eng.trigger.stats().bucket_tokens
        decision = eng.preinfer("long", whole, num_candidates=10)
        assert (decision.admitted, decision.reason) == (False, "too_long")
        assert eng.trigger.stats().bucket_tokens == before and eng.ledger.of_user("long") == []
        assert eng.preinfer("long", first(whole, capacity), num_candidates=10).admitted  # a slot's worth fits
        settle(eng)
        assert eng.stats().work.prefill_no_slot == 0 and eng.trigger.counts()["too_long"] == 1
