"""RelayEngine on the tiny model: hand-off, in-flight waits, misses, baseline, concurrency, shutdown."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.model.inputs import validate_history
from mindspore_relaygr.relay.engine import RelayEngine
from mindspore_relaygr.relay.executor import RANK
from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint
from tests.conftest import CONFIGS, random_history
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TOL = 1e-5
BASE = ["relay.warmup=false", "trigger.slo_ms=50", "trigger.prefill_chunk_len=32", "cache.num_slots=4"]


def latency(full_ms: float, prefill_ms: float = 20.0) -> LatencyModel:
    return LatencyModel([LatencyPoint("full", 128, 32, 0, full_ms), LatencyPoint("relay", 128, 16, 32, 5.0),
                         LatencyPoint("prefill", 128, 0, 0, prefill_ms)])


@pytest.fixture(scope="module")
def model():
    from mindspore_relaygr.model import RelayGRModel
    from tests.model.conftest import randomize_weights

    m = RelayGRModel(load_config(CONFIGS / "tiny.yaml", ["cache.num_slots=4"]))
    randomize_weights(m, seed=3)
    return m


@pytest.fixture
def make_engine(model):
    engines = []

    def make(*overrides, full_ms=200.0, prefill_ms=20.0):
        eng = RelayEngine(load_config(CONFIGS / "tiny.yaml", [*BASE, *overrides]), model,
                          latency(full_ms, prefill_ms))
        engines.append(eng)
        return eng

    yield make
    for eng in engines:
        eng.close()


def hist(seed, n=100):
    return random_history(np.random.default_rng(seed), n, user_features=[1, 2])


def first_of(h, n):
    return {k: (v if k == "user_features" else v[:n]) for k, v in h.items()}


def last_of(h, n):
    return {k: (v if k == "user_features" else v[-n:]) for k, v in h.items()}


def validate(h):
    return validate_history(load_config(CONFIGS / "tiny.yaml").model, h)


def expected(model, engine, h, cands):
    """Reference scores computed on the engine's device thread (never two MindSpore callers at once)."""
    return engine.executor.submit(lambda: model.rank_full(h, cands)).result()


def test_rank_after_preinfer_is_served_from_the_cache(make_engine, model):
    eng = make_engine()
    h, cands = hist(1), np.arange(1, 21)
    decision = eng.preinfer("u1", h, num_candidates=20)
    assert decision.admitted and decision.reason == "admitted" and decision.cache_key
    eng.wait_prefills(60)
    res = eng.rank("u1", h, cands, top_k=5)
    assert res.cache == "device"
    np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)
    assert len(res.ranking) == 5 and res.scores[res.ranking[0]].sum() == res.scores.sum(1).max()
    assert eng.stats().work.prefill_chunks == 4  # 101 tokens in chunks of 32
    assert eng.preinfer("u1", h).reason == "already_cached"


def test_rank_during_the_prefill_waits_for_it_and_only_one_prefill_runs(make_engine, model):
    eng = make_engine("relay.inflight_wait_ms=10000")
    calls = []
    original = model.prefill_batch
    model.prefill_batch = lambda chunks: calls.append(len(chunks)) or original(chunks)  # one chunk per call
    try:
        gate = threading.Event()
        eng.executor.submit(lambda: gate.wait(10))  # hold the device so the prefill is still queued
        h, cands = hist(2), np.arange(5, 25)
        assert eng.preinfer("u2", h).admitted
        assert eng.preinfer("u2", h).reason == "inflight"
        with ThreadPoolExecutor(1) as pool:
            ranked = pool.submit(eng.rank, "u2", h, cands)
            wait_until(lambda: eng.stats().work.inflight_waits == 1, what="the rank to wait for the prefill")
            gate.set()
            res = ranked.result(60)
    finally:
        model.prefill_batch = original
    assert res.cache == "inflight" and res.timings_ms["wait"] > 0
    np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)
    assert eng.stats().work.prefills == 1 and len(calls) == 4


def test_a_waiting_rank_boosts_its_prefill_ahead_of_an_earlier_users_prefill(make_engine, model):
    eng = make_engine("relay.inflight_wait_ms=0")  # patience comes from the predicted remaining chunks
    finished = []
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))
    ha, hb, cands = hist(21, 120), hist(22, 120), np.arange(1, 11)
    assert eng.preinfer("a", ha).admitted and eng.preinfer("b", hb).admitted
    for user in ("a", "b"):
        eng.ledger.of_user(user)[0].future.add_done_callback(lambda f, u=user: finished.append(u))
    with ThreadPoolExecutor(1) as pool:
        ranked = pool.submit(eng.rank, "b", hb, cands)
        wait_until(lambda: eng.stats().work.inflight_boosts == 1, what="the rank to boost b's queued prefill")
        gate.set()
        res = ranked.result(60)
    eng.wait_prefills(60)
    assert res.cache == "inflight" and eng.stats().work.inflight_boosts == 1
    assert finished == ["b", "a"]  # b's prefill ran first although a's was admitted first
    np.testing.assert_allclose(res.scores, expected(model, eng, hb, cands), atol=TOL, rtol=0)


def test_a_prefill_predicted_slower_than_a_miss_is_waited_for_only_inflight_wait_ms(make_engine, model):
    eng = make_engine("relay.inflight_wait_ms=50", prefill_ms=5000.0)
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))
    h, cands = hist(23, 120), np.arange(1, 11)
    assert eng.preinfer("c", h).admitted
    with ThreadPoolExecutor(1) as pool:
        ranked = pool.submit(eng.rank, "c", h, cands)
        wait_until(lambda: eng.stats().work.inflight_wait_timeouts == 1, what="the rank's 50 ms patience to run out")
        gate.set()
        res = ranked.result(60)
    assert res.cache == "miss" and res.timings_ms["wait"] > 0  # waited, then gave up: not served from it
    assert eng.stats().work.inflight_wait_timeouts == 1 and eng.stats().work.inflight_boosts == 0
    np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)


def test_a_prefill_that_progressed_while_the_rank_waited_is_boosted_then_not_abandoned(model):
    # 121 tokens in 4 chunks predicted at 60 ms each: 240 ms left beats no 200 ms miss at first, so the rank
    # waits inflight_wait_ms only; by then 2 chunks are done and the 120 ms left do beat the miss.
    profile = LatencyModel([LatencyPoint("full", 128, 32, 0, 200.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                            *(LatencyPoint("prefill", n, 0, 0, 60.0 * n / 32) for n in (32, 64, 96, 128))])
    eng = RelayEngine(load_config(CONFIGS / "tiny.yaml", [*BASE, "relay.inflight_wait_ms=1500"]), model, profile)
    rank_judged, chunk_gate, calls = threading.Event(), threading.Event(), []
    original = model.prefill_batch

    def prefill_batch(chunks):
        calls.append(len(chunks))
        if len(calls) == 1:  # no chunk is done when the rank is first judged
            rank_judged.wait(30)
        if len(calls) == 3:  # the third chunk holds the device until the rank has been judged again
            chunk_gate.wait(30)
        return original(chunks)

    model.prefill_batch = prefill_batch
    try:
        h, cands = hist(24, 120), np.arange(1, 11)
        assert eng.preinfer("d", h).admitted
        with ThreadPoolExecutor(1) as pool:
            ranked = pool.submit(eng.rank, "d", h, cands)
            wait_until(lambda: eng.stats().work.inflight_waits, what="the rank to judge the prefill")
            rank_judged.set()
            wait_until(lambda: eng.stats().work.inflight_boosts, what="the rank to boost the prefill")
            chunk_gate.set()
            res = ranked.result(60)
        eng.wait_prefills(60)
        work = eng.stats().work
        assert work.inflight_boosts == 1 and work.inflight_wait_timeouts == 0
        assert res.cache == "inflight" and res.timings_ms["wait"] >= 1500  # the first wait ran out, not the second
        assert work.prefills == 1 and len(calls) == 4
        np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)
    finally:
        rank_judged.set()
        chunk_gate.set()
        model.prefill_batch = original
        eng.close()


def test_rank_without_preinfer_falls_back_to_full_inference(make_engine, model):
    eng = make_engine()
    h, cands = hist(3), np.arange(30, 40)
    res = eng.rank("u3", h, cands)
    assert res.cache == "miss" and not res.truncated
    np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)


def test_a_returning_user_whose_history_grew_reuses_the_cached_prefix(make_engine, model):
    eng = make_engine()
    full = hist(6, 126)

    def first(n):
        return {k: (v if k == "user_features" else v[:n]) for k, v in full.items()}

    assert eng.preinfer("u6", first(60), num_candidates=10).admitted
    eng.wait_prefills(60)
    decision = eng.preinfer("u6", first(66), num_candidates=10)
    assert not decision.admitted and decision.reason == "already_cached"  # 6 new events fit the suffix
    cands = np.arange(1, 11)
    res = eng.rank("u6", first(66), cands)
    assert res.cache == "device" and eng.stats().work.prefills == 1
    np.testing.assert_allclose(res.scores, expected(model, eng, first(66), cands), atol=TOL, rtol=0)
    # 66 new events, more than the 16-event suffix: the 60-event prefix is extended in its slot by
    # just those (3 chunks of 32), not prefilled afresh (defect 6).
    assert eng.preinfer("u6", full, num_candidates=10).admitted
    eng.wait_prefills(60)
    work = eng.stats().work
    assert (work.prefills, work.extensions, work.extension_chunks) == (1, 1, 3)
    res = eng.rank("u6", full, cands)
    assert res.cache == "device"
    np.testing.assert_allclose(res.scores, expected(model, eng, full, cands), atol=TOL, rtol=0)
    # A rank whose history grew past the suffix without a pre-infer extends in the rank (partial).
    more = hist(6, 126)
    assert eng.preinfer("u7", first_of(more, 40), num_candidates=10).admitted
    eng.wait_prefills(60)
    res = eng.rank("u7", more, cands)
    assert res.cache == "partial"
    np.testing.assert_allclose(res.scores, expected(model, eng, more, cands), atol=TOL, rtol=0)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_preinfer_that_finds_the_prefix_in_dram_reloads_it_before_the_rank(make_engine, model, prefetch):
    eng = make_engine(f"expander.enable_prefetch={str(prefetch).lower()}")
    users = {f"p{i}": hist(40 + i, 60) for i in range(5)}  # one more user than the 4 slots
    cands = np.arange(1, 11)
    for user, h in users.items():
        assert eng.preinfer(user, h, num_candidates=10).admitted
        eng.wait_prefills(60)
        assert eng.rank(user, h, cands).cache == "device"  # consumed: the trigger's footprint stays small
    p0 = validate_history(model.cfg, users["p0"])
    assert eng.cache.locate("p0", p0)[0] == "dram"  # the least recently used went to DRAM
    assert eng.preinfer("p0", users["p0"], num_candidates=10).reason == "already_cached"
    eng.executor.submit(lambda: None, 1).result(60)  # behind the prefetch (same priority, FIFO)
    assert eng.stats().work.dram_prefetches == int(prefetch)
    res = eng.rank("p0", users["p0"], cands)
    assert res.cache == ("device" if prefetch else "dram")
    np.testing.assert_allclose(res.scores, expected(model, eng, users["p0"], cands), atol=TOL, rtol=0)


def test_a_prefill_that_spills_an_evicted_slot_does_it_in_a_device_step_of_its_own(make_engine, model):
    eng = make_engine()
    users = {f"s{i}": hist(80 + i, 100) for i in range(5)}  # one more user than the 4 slots
    chunks = -(-100 // 32)  # 4 chunks of 32 events (the tiny model has a user token: 101 tokens)
    cands = np.arange(1, 11)
    for user, h in users.items():
        assert eng.preinfer(user, h, num_candidates=10).admitted
        eng.wait_prefills(60)
        assert eng.rank(user, h, cands).cache == "device"  # consumed: the trigger's footprint stays small
    steps = eng.stats().device_steps["prefill_chunk"]["steps"]
    assert eng.cache.spills == 1 and eng.stats().work.prefill_chunks == 5 * chunks
    assert steps == 5 * chunks + 1  # the fifth prefill: one spill step, then its chunks
    s0 = validate_history(model.cfg, users["s0"])
    assert eng.cache.locate("s0", s0)[0] == "dram"
    res = eng.rank("s0", users["s0"], cands)
    assert res.cache == "dram"  # reloaded from its spilled copy, not recomputed
    np.testing.assert_allclose(res.scores, expected(model, eng, users["s0"], cands), atol=TOL, rtol=0)


def test_a_rank_right_after_a_prefetching_preinfer_waits_for_the_copy_instead_of_missing(make_engine, model):
    eng = make_engine()
    users = {f"q{i}": hist(60 + i, 60) for i in range(5)}  # one more user than the 4 slots
    cands = np.arange(1, 11)
    for user, h in users.items():
        assert eng.preinfer(user, h, num_candidates=10).admitted
        eng.wait_prefills(60)
        eng.rank(user, h, cands)
    assert eng.cache.locate("q0", validate_history(model.cfg, users["q0"]))[0] == "dram"
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))  # the copy cannot have finished when the rank arrives
    assert eng.preinfer("q0", users["q0"], num_candidates=10).reason == "already_cached"
    with ThreadPoolExecutor(1) as pool:
        ranked = pool.submit(eng.rank, "q0", users["q0"], cands)
        wait_until(lambda: eng.stats().work.inflight_waits == 1, what="the rank to wait for the copy")
        gate.set()
        res = ranked.result(60)
    assert res.cache == "inflight" and eng.stats().work.dram_prefetches == 1  # waited for the copy
    assert eng.cache.stats().dram.reloads == 1  # copied once, by the prefetch
    # The pool was full: making room spilled another user (a step of its own), then a layer per step.
    assert eng.cache.spills == 2
    assert eng.executor.step_stats()["dram_prefetch"]["steps"] == 1 + model.layout.num_layers
    np.testing.assert_allclose(res.scores, expected(model, eng, users["q0"], cands), atol=TOL, rtol=0)


def test_truncate_policy_and_baseline_mode(make_engine, model):
    h, cands = hist(4, 120), np.arange(1, 9)
    recent = {k: (v if k == "user_features" else v[-50:]) for k, v in h.items()}
    eng = make_engine("relay.miss_policy=truncate", "relay.max_online_len=50")
    res = eng.rank("u4", h, cands)
    assert res.cache == "miss" and res.truncated and res.ranked_events == 50  # nothing fits 50 ms: the cap
    np.testing.assert_allclose(res.scores, expected(model, eng, recent, cands), atol=TOL, rtol=0)
    base = make_engine("relay.enabled=false", "relay.max_online_len=50")
    assert base.preinfer("u4", h).reason == "disabled"
    res = base.rank("u4", h, cands)
    assert res.cache == "bypass" and res.truncated
    np.testing.assert_allclose(res.scores, expected(model, base, recent, cands), atol=TOL, rtol=0)


def test_truncate_policy_ranks_the_events_that_fit_the_rest_of_the_budget(model):
    # Full path: 1 ms up to 8 tokens, 30 ms up to 16, 80 ms up to 128 (the user token counts); SLO 50 ms.
    steps = LatencyModel([LatencyPoint("full", 8, 8, 0, 1.0), LatencyPoint("full", 16, 8, 0, 30.0),
                          LatencyPoint("full", 128, 8, 0, 80.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                          LatencyPoint("prefill", 128, 0, 0, 20.0)])
    now = [100.0]  # the engine's clock (seconds): it moves only when the busy step below says so
    eng = RelayEngine(load_config(CONFIGS / "tiny.yaml", [*BASE, "relay.miss_policy=truncate",
                                                          "relay.max_online_len=50"]), model, steps,
                      clock=lambda: now[0])
    try:
        h, cands = hist(9, 40), np.arange(1, 9)
        assert eng._miss_events(validate(h), cands, elapsed_ms=0.0) == 15  # 16 tokens: 30 ms <= 50
        assert eng._miss_events(validate(h), cands, elapsed_ms=30.0) == 7  # 20 ms left: 8 tokens
        assert eng._miss_events(validate(h), cands, elapsed_ms=49.5) == 50  # nothing fits: the production cap
        assert eng._miss_events(validate(first_of(h, 7)), cands, elapsed_ms=30.0) == 127  # 1 ms fits: all of it
        res = eng.rank("u9", h, cands)  # unloaded
        assert res.cache == "miss" and res.truncated and res.ranked_events == 15
        np.testing.assert_allclose(res.scores, expected(model, eng, last_of(h, 15), cands), atol=TOL, rtol=0)
        # Under queue pressure: the device thread is busy for 25 ms after the rank arrived, leaving 25 ms.
        gate = threading.Event()

        def busy() -> None:
            assert gate.wait(10)
            now[0] += 0.025

        eng.executor.submit(busy, RANK, label="busy")
        with ThreadPoolExecutor(1) as pool:
            ranked = pool.submit(eng.rank, "u9", h, cands)
            wait_until(lambda: eng.executor.depth() == 1, what="the rank to queue behind the busy step")
            gate.set()
            res = ranked.result(60)
        assert res.truncated and res.ranked_events == 7 and res.timings_ms["queue"] == pytest.approx(25.0)
        np.testing.assert_allclose(res.scores, expected(model, eng, last_of(h, 7), cands), atol=TOL, rtol=0)
        assert eng.stats().work.truncations == 2
    finally:
        eng.close()


def test_not_at_risk_requests_are_not_relayed(make_engine):
    eng = make_engine(full_ms=10.0)  # 10 ms < 50 ms * 0.8
    decision = eng.preinfer("u5", hist(5))
    assert not decision.admitted and decision.reason == "not_at_risk" and decision.cache_key is None


def test_a_rank_submitted_during_a_long_prefill_finishes_first(make_engine):
    eng = make_engine()
    finished = []  # in the order the work finished
    gate = threading.Event()
    eng.executor.submit(lambda: gate.wait(10))
    assert eng.preinfer("long", hist(6, 127)).admitted
    eng.executor.submit_steps(iter(()), priority=1).add_done_callback(  # queued right behind the prefill
        lambda f: finished.append("prefill"))
    with ThreadPoolExecutor(1) as pool:
        ranked = pool.submit(lambda: eng.rank("other", hist(7, 20), [1, 2, 3]))
        wait_until(lambda: eng.executor.depth() == 3, what="the rank to queue behind the prefill")
        gate.set()
        ranked.add_done_callback(lambda f: finished.append("rank"))
        ranked.result(60)
    eng.wait_prefills(60)
    wait_until(lambda: len(finished) == 2, what="both callbacks")
    assert finished == ["rank", "prefill"]


def test_prefills_admitted_together_are_batched_on_the_device_and_ranked_exactly(make_engine, model):
    """relay.max_prefill_batch 4 on the tiny model: four relays admitted while the device is busy write their
    chunks through the batched prefix graphs (first chunks, then extensions, four at a time while four are
    left); every rank from their slots equals rank_full within R1."""
    eng = make_engine("relay.max_prefill_batch=4")
    users = {f"p{i}": hist(900 + i, 40 + 20 * i) for i in range(4)}  # 2, 2, 3 and 4 chunks of 32 tokens
    cands = np.arange(1, 17)
    gate, running = threading.Event(), threading.Event()
    eng.executor.submit(lambda: running.set() or gate.wait(30))
    assert running.wait(30)
    model.call_stats.reset()
    for u, h in users.items():
        assert eng.preinfer(u, h, num_candidates=16).admitted
    gate.set()
    eng.wait_prefills(120)
    kinds = {row["kind"] for row in model.call_stats.slowest(100)}
    assert {"prefix_batch", "extend_batch"} <= kinds and eng.executor.batch_stats()["prefill_chunk"].get(4) == 2
    for u, h in users.items():
        res = eng.rank(u, h, cands)
        assert res.cache == "device"
        assert float(np.abs(res.scores - expected(model, eng, h, cands)).max()) <= TOL


@pytest.mark.parametrize("batch", [1, 4])
def test_eight_threads_never_crash_and_always_get_correct_scores(make_engine, model, batch):
    """Ranks and prefill chunks one per device call, and batched (relay.max_rank_batch, max_prefill_batch 4)."""
    eng = make_engine("relay.inflight_wait_ms=5000", f"relay.max_rank_batch={batch}",
                      f"relay.max_prefill_batch={batch}")
    users = {f"c{i}": hist(100 + i, 40 + 10 * i) for i in range(6)}
    cands = np.arange(1, 17)
    want = {u: expected(model, eng, h, cands) for u, h in users.items()}

    def client(i):
        rng = np.random.default_rng(i)
        out = []
        for _ in range(6):
            user = f"c{rng.integers(6)}"
            if rng.random() < 0.4:
                eng.preinfer(user, users[user])
            else:
                res = eng.rank(user, users[user], cands)
                out.append(float(np.abs(res.scores - want[user]).max()))
        return out

    with ThreadPoolExecutor(8) as pool:
        diffs = [d for f in [pool.submit(client, i) for i in range(8)] for d in f.result(120)]
    assert diffs and max(diffs) <= TOL
    ranks = eng.stats().ranks
    assert sum(getattr(ranks, tier) for tier in ("device", "dram", "partial", "inflight", "miss")) == len(diffs)


def test_close_leaves_no_threads_behind(model):
    before = {t.name for t in threading.enumerate()}
    eng = RelayEngine(load_config(CONFIGS / "tiny.yaml", BASE), model, latency(200.0), instance_id="closing")
    eng.preinfer("z", hist(9))
    eng.rank("z", hist(9), [1, 2])
    eng.close()
    after = {t.name for t in threading.enumerate()}
    assert "relaygr-device-closing" not in after and after <= before | {"MainThread"}


def test_the_audit_detects_a_corrupted_device_slot_and_drops_it(make_engine, model):
    eng = make_engine("relay.audit_fraction=1.0")
    h, cands = hist(40), np.arange(1, 21)
    assert eng.preinfer("audited", h, num_candidates=20).admitted
    eng.wait_prefills(60)
    key = eng.cache.key_for("audited", validate_history(eng.config.model, h))
    slot = eng.cache.manager.peek(key).slot

    def corrupt():
        copy = model.export_slot(slot)
        copy.values[:, :, 3] += 0.5  # one token's values in every layer
        model.import_slot(slot, copy)

    eng.executor.submit(corrupt).result()
    assert eng.rank("audited", h, cands).cache == "device"
    eng.wait_audits(60)
    audit = eng.stats().audit
    assert (audit.checked, audit.failures) == (1, 1) and audit.max_abs_diff > TOL
    assert eng.cache.locate("audited", validate_history(eng.config.model, h)) == ("miss", None)
    res = eng.rank("audited", h, cands)
    assert res.cache == "miss"
    np.testing.assert_allclose(res.scores, expected(model, eng, h, cands), atol=TOL, rtol=0)


def test_queued_ranks_run_as_one_batched_call_with_exact_scores(make_engine, model):
    eng = make_engine("relay.max_rank_batch=4")
    users = {f"b{i}": hist(90 + i, 60 + 20 * i) for i in range(3)}
    cands = {u: np.arange(1 + i, 12 + 5 * i) for i, u in enumerate(users)}
    for u, h in users.items():
        assert eng.preinfer(u, h, num_candidates=10).admitted
    eng.wait_prefills(60)
    gate, running = threading.Event(), threading.Event()
    eng.executor.submit(lambda: running.set() or gate.wait(30))
    assert running.wait(30)
    with ThreadPoolExecutor(3) as pool:
        futures = {u: pool.submit(eng.rank, u, h, cands[u]) for u, h in users.items()}
        wait_until(lambda: eng.executor.depth() == 3, what="the three ranks to queue")
        gate.set()
        results = {u: f.result(60) for u, f in futures.items()}
    assert eng.executor.batch_stats()["rank"] == {3: 1}
    for u, h in users.items():
        assert results[u].cache == "device"
        np.testing.assert_allclose(results[u].scores, expected(model, eng, h, cands[u]), atol=TOL, rtol=0)
