"""Sequence-aware trigger over the ledger's footprint: every reason at its boundary, bounds under
random streams, thread safety."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mindspore_relaygr.cache.keys import CacheKey
from mindspore_relaygr.config import TriggerConfig, load_config
from mindspore_relaygr.relay.engine import RelayEngine
from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint
from mindspore_relaygr.relay.ledger import PREFILL, RelayLedger, RelayState
from mindspore_relaygr.relay.trigger import REASONS, SequenceAwareTrigger
from tests.conftest import CONFIGS, random_history
from tests.relay.fake_model import FakeModel
from tests.relay.test_engine_fake import BASE, latency

# Full path costs exactly 1/16 ms per token: with the default slo_ms=50, risk_margin=0.8 the budget is
# 40 ms, so 640 tokens are exactly at the budget (not at risk) and 641 tokens are at risk.
LATENCY = LatencyModel([LatencyPoint("full", 0, 16, 0, 0.0), LatencyPoint("full", 1024, 16, 0, 64.0)],
                       interpolation="linear")
AT_RISK = 656  # 41 ms


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Admission:
    """What the engine does around the trigger: decide under the ledger's lock, record admissions in
    the ledger, and move relays through it (oldest first)."""

    def __init__(self, trigger: SequenceAwareTrigger) -> None:
        self.trigger, self.ledger, self._n = trigger, RelayLedger(ready_ttl_ms=1e9), 0

    def decide(self, prefix_len, num_candidates, already_cached=False, inflight=False):
        with self.ledger.lock:
            d = self.trigger.decide(prefix_len, num_candidates, self.ledger.footprint(), already_cached, inflight)
            if d.admitted:
                self._n += 1
                self.ledger.admit("u", CacheKey("u", "v", self._n, str(self._n)), PREFILL, [1.0])
            return d

    def _oldest(self, state):
        return min((r.key for r in self.ledger.of_user("u") if r.state is state), key=lambda k: k.prefix_len)

    def on_ready(self) -> None:
        key = self._oldest(RelayState.ADMITTED)
        self.ledger.start(key)
        self.ledger.ready(key)

    def on_consumed(self) -> None:
        assert self.ledger.consume(self._oldest(RelayState.READY))

    def on_dropped(self, ready: bool) -> None:
        self.ledger.drop(self._oldest(RelayState.READY if ready else RelayState.ADMITTED), "failed")

    def counts(self):
        return self.trigger.counts()

    def state(self) -> dict[str, float]:
        fp = self.ledger.footprint()
        return {"inflight_slots": fp.inflight, "inflight_bytes": fp.inflight * self.trigger.slot_bytes,
                "queued_prefills": fp.pending, "bucket_tokens": self.trigger.stats().bucket_tokens}


def make(clock: FakeClock | None = None, slot_bytes: int = 100, num_slots: int = 64, slot_tokens: int | None = None,
         **cfg) -> Admission:
    cfg.setdefault("max_queued_prefills", 64)
    cfg.setdefault("prefill_burst_tokens", 1 << 20)
    return Admission(SequenceAwareTrigger(
        TriggerConfig(**cfg), LATENCY, slot_bytes=slot_bytes, num_slots=num_slots, clock=clock or FakeClock(),
        slot_tokens=slot_tokens,
    ))


def test_risk_boundary_is_exclusive():
    trig = make()
    at_budget = trig.decide(640, 16)
    assert (at_budget.admitted, at_budget.reason, at_budget.predicted_full_ms) == (False, "not_at_risk", 40.0)
    over = trig.decide(641, 16)
    assert (over.admitted, over.reason, over.predicted_full_ms) == (True, "admitted", 40.0625)


def test_short_prefixes_are_never_relayed():
    trig = make(min_prefix_len=700)
    assert trig.decide(699, 16).reason == "not_at_risk"  # at risk, but shorter than min_prefix_len
    assert trig.decide(700, 16).reason == "admitted"


def test_min_prefix_len_counts_events_not_the_user_token():
    trig = Admission(SequenceAwareTrigger(TriggerConfig(min_prefix_len=700, max_queued_prefills=64), LATENCY,
                                          slot_bytes=100, num_slots=64, clock=FakeClock(), user_tokens=1))
    assert trig.decide(700, 16).reason == "not_at_risk"  # 699 events and the user token
    assert trig.decide(701, 16).reason == "admitted"
    with pytest.raises(ValueError, match="user_tokens=-1"):
        SequenceAwareTrigger(TriggerConfig(), LATENCY, slot_bytes=100, num_slots=1, user_tokens=-1)


def test_an_empty_history_is_never_relayed():
    """A pre-infer of 0 events (only the user token) was admitted although trigger.min_prefix_len is 1."""
    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "trigger.min_prefix_len=1"])
    engine = RelayEngine(cfg, FakeModel(cfg), latency())  # every prefix is at risk: a 200 ms full path
    try:
        empty, one = (random_history(np.random.default_rng(0), n, user_features=[1, 2]) for n in (0, 1))
        result = engine.preinfer("u0", empty, num_candidates=10)
        assert (result.admitted, result.reason, result.cache_key) == (False, "not_at_risk", None)
        assert engine.preinfer("u1", one, num_candidates=10).admitted
        assert engine.stats().trigger.decisions["not_at_risk"] == 1
    finally:
        engine.close()


def test_cached_and_inflight_keys_come_first():
    trig = make(max_queued_prefills=1)
    assert trig.decide(AT_RISK, 16, already_cached=True, inflight=True).reason == "already_cached"
    assert trig.decide(AT_RISK, 16, inflight=True).reason == "inflight"
    assert trig.decide(10, 16, inflight=True).reason == "inflight"  # even when not at risk
    assert trig.state()["inflight_slots"] == 0  # refusals reserve nothing


def test_slot_footprint_bound_and_release():
    trig = make(num_slots=3)
    assert [trig.decide(AT_RISK, 16).reason for _ in range(4)] == ["admitted"] * 3 + ["footprint"]
    trig.on_ready()
    trig.on_consumed()  # a READY relay consumed by its rank leaves the footprint
    assert trig.decide(AT_RISK, 16).reason == "admitted"
    trig.on_dropped(ready=False)  # a prefill that failed leaves it too
    assert trig.decide(AT_RISK, 16).reason == "admitted"
    assert trig.decide(AT_RISK, 16).reason == "footprint"


@pytest.mark.parametrize(("max_slots", "num_slots", "expected"), [(2, 5, 2), (10, 3, 3), (None, 4, 4)])
def test_max_inflight_slots_is_capped_by_the_pool(max_slots, num_slots, expected):
    trig = make(num_slots=num_slots, max_inflight_slots=max_slots)
    reasons = [trig.decide(AT_RISK, 16).reason for _ in range(expected + 1)]
    assert reasons == ["admitted"] * expected + ["footprint"]


@pytest.mark.parametrize(("max_bytes", "expected"), [(250.0, 2), (300.0, 3), (100.0, 1)])
def test_byte_footprint_bound_is_inclusive(max_bytes, expected):
    trig = make(slot_bytes=100, max_inflight_bytes=max_bytes)
    reasons = [trig.decide(AT_RISK, 16).reason for _ in range(expected + 1)]
    assert reasons == ["admitted"] * expected + ["footprint"]
    assert trig.state()["inflight_bytes"] == expected * 100


def test_byte_bound_below_one_slot_is_a_config_error():
    with pytest.raises(ValueError, match="max_inflight_bytes=50.0: smaller than one slot"):
        make(slot_bytes=100, max_inflight_bytes=50.0)
    with pytest.raises(ValueError, match="slot_bytes=0"):
        make(slot_bytes=0)
    with pytest.raises(ValueError, match="num_slots=0"):
        make(num_slots=0)


def test_queued_prefill_cap():
    trig = make(max_queued_prefills=2)
    assert [trig.decide(AT_RISK, 16).reason for _ in range(3)] == ["admitted", "admitted", "load"]
    trig.on_ready()  # one prefill finished: READY but unconsumed, no longer queued
    assert trig.decide(AT_RISK, 16).reason == "admitted"
    assert trig.state()["queued_prefills"] == 2 and trig.state()["inflight_slots"] == 3


def test_token_bucket_refills_at_rate_and_charges_only_admissions():
    clock = FakeClock()
    trig = make(clock, max_prefill_tokens_per_s=1024.0, prefill_burst_tokens=2048)
    assert [trig.decide(AT_RISK, 16).reason for _ in range(4)] == ["admitted"] * 3 + ["load"]
    assert trig.state()["bucket_tokens"] == 2048 - 3 * AT_RISK  # 80: the refusal took nothing
    clock.now = 0.5625 - 1 / 1024  # one token short of AT_RISK
    assert trig.decide(AT_RISK, 16).reason == "load"
    clock.now = 0.5625  # 80 + 576 = AT_RISK tokens: exactly enough
    assert trig.decide(AT_RISK, 16).reason == "admitted"
    assert trig.state()["bucket_tokens"] == 0
    clock.now = 1000.0
    assert trig.state()["bucket_tokens"] == 2048  # capped at the depth


def test_prefix_longer_than_the_bucket_waits_for_a_full_bucket_then_owes():
    clock = FakeClock()
    trig = make(clock, max_prefill_tokens_per_s=1024.0, prefill_burst_tokens=1024)
    assert trig.decide(3072, 16).reason == "admitted"  # a full bucket admits it...
    assert trig.state()["bucket_tokens"] == 1024 - 3072  # ...and leaves it in debt
    clock.now = 2.0 + AT_RISK / 1024 - 1 / 1024
    assert trig.decide(AT_RISK, 16).reason == "load"
    clock.now = 2.0 + AT_RISK / 1024
    assert trig.decide(AT_RISK, 16).reason == "admitted"


def test_footprint_is_checked_before_load_and_every_decision_is_counted():
    trig = make(num_slots=1, max_queued_prefills=1, slot_tokens=AT_RISK)
    trig.decide(AT_RISK, 16)
    assert trig.decide(AT_RISK, 16).reason == "footprint"  # both bounds hit: footprint reported
    trig.decide(AT_RISK, 16, already_cached=True)
    trig.decide(AT_RISK, 16, inflight=True)
    trig.decide(1, 16)
    assert trig.decide(AT_RISK + 1, 16).reason == "too_long"  # no slot holds it, whatever the footprint
    counts = trig.counts()
    assert counts == {"admitted": 1, "not_at_risk": 1, "footprint": 1, "load": 0, "already_cached": 1, "inflight": 1,
                      "too_long": 1}
    assert list(counts) == list(REASONS)


def test_bad_queries_raise():
    with pytest.raises(ValueError, match="tokens=-3"):
        make().decide(-3, 16)


OPS = st.one_of(
    st.tuples(
        st.just("decide"), st.integers(0, 3000), st.sampled_from([(False, False)] * 4 + [(True, False), (False, True)])
    ),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.001, 0.01, 0.1, 0.5, 2.0])),
    st.tuples(st.just("ready"), st.integers(0, 10)),
    st.tuples(st.just("consume"), st.integers(0, 10)),
    st.tuples(st.just("drop"), st.booleans(), st.integers(0, 10)),
)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(OPS, max_size=80),
    num_slots=st.integers(1, 6),
    max_bytes=st.sampled_from([None, 250.0, 400.0]),
    queued=st.integers(1, 4),
    burst=st.sampled_from([700, 2000, 5000]),
    rate=st.sampled_from([500.0, 4000.0]),
)
def test_bounds_hold_under_random_streams(ops, num_slots, max_bytes, queued, burst, rate):
    clock = FakeClock()
    trig = make(
        clock,
        slot_bytes=100,
        num_slots=num_slots,
        max_inflight_bytes=max_bytes,
        max_queued_prefills=queued,
        prefill_burst_tokens=burst,
        max_prefill_tokens_per_s=rate,
    )
    reserved, ready = 0, 0  # the engine's view: relays pre-inferring, relays READY and unconsumed
    bucket, last, decisions = float(burst), 0.0, 0
    for op in ops:
        if op[0] == "decide":
            prefix, (cached, inflight) = op[1], op[2]
            bucket = min(burst, bucket + (clock.now - last) * rate)
            last = clock.now
            d = trig.decide(prefix, 16, already_cached=cached, inflight=inflight)
            decisions += 1
            assert d.admitted == (d.reason == "admitted") and d.reason in REASONS
            at_risk = prefix >= 1 and LATENCY.predict_full_ms(prefix, 16) > 40.0
            if not (cached or inflight):
                assert (d.reason == "not_at_risk") == (not at_risk)
            if d.admitted:
                assert bucket >= min(prefix, burst)  # admitted only with enough tokens
                bucket -= prefix
                reserved += 1
        elif op[0] == "tick":
            clock.now += op[1]
        elif op[0] == "ready" and reserved:
            trig.on_ready()
            reserved, ready = reserved - 1, ready + 1
        elif op[0] == "consume" and ready:
            trig.on_consumed()
            ready -= 1
        elif op[0] == "drop" and (ready if op[1] else reserved):
            trig.on_dropped(ready=op[1])
            ready, reserved = (ready - 1, reserved) if op[1] else (ready, reserved - 1)
        state = trig.state()
        last, bucket = clock.now, min(burst, bucket + (clock.now - last) * rate)  # state() refills too
        assert state["inflight_slots"] == reserved + ready <= num_slots
        assert max_bytes is None or state["inflight_bytes"] <= max_bytes
        assert state["queued_prefills"] == reserved <= queued
        assert state["bucket_tokens"] == pytest.approx(bucket)
    assert sum(trig.counts().values()) == decisions


def test_concurrent_deciders_never_overshoot():
    def yielding_clock() -> float:  # called between the bound checks and the accounting: invites a race
        time.sleep(0.0001)
        return 0.0

    trig = Admission(SequenceAwareTrigger(
        TriggerConfig(max_queued_prefills=64), LATENCY, slot_bytes=100, num_slots=7, clock=yielding_clock
    ))
    results: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(50):
            r = trig.decide(AT_RISK, 16).reason
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("admitted") == 7 and results.count("footprint") == 8 * 50 - 7
    assert trig.counts()["admitted"] == 7


def test_an_extension_needs_no_new_slot_and_costs_only_its_tokens():
    trig = make(num_slots=1, prefill_burst_tokens=1000, max_prefill_tokens_per_s=1.0)
    assert trig.decide(AT_RISK, 16).reason == "admitted"  # the pool's one slot, 656 tokens from the bucket
    assert trig.decide(AT_RISK, 16).reason == "footprint"
    ext = trig.trigger.decide(AT_RISK, 16, trig.ledger.footprint(), extension_tokens=300)
    assert ext.reason == "admitted" and trig.trigger.stats().bucket_tokens == pytest.approx(44.0, abs=0.01)
    assert trig.trigger.decide(AT_RISK, 16, trig.ledger.footprint(), extension_tokens=300).reason == "load"
