"""Ranks batched on the device thread (relay.max_rank_batch): the ranks already queued when one comes up
run in one model call; nothing waits for a batch to fill; a miss in the batch is computed on its own."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mindspore_relaygr import load_config
from mindspore_relaygr.relay.engine import RelayEngine
from mindspore_relaygr.relay.latency import LatencyModel
from tests.conftest import CONFIGS
from tests.relay.fake_model import FakeModel
from tests.relay.test_engine_fake import BASE, CANDS, clocked_engine, hist, latency, relay
from tests.waiting import wait_until


def hold_device_thread(eng) -> threading.Event:
    """Occupy the engine's device thread until the returned event is set, so the work submitted meanwhile queues."""
    gate, running = threading.Event(), threading.Event()
    eng.executor.submit(lambda: running.set() or gate.wait(10))
    assert running.wait(10)
    return gate


def queued_ranks(eng, users: dict[str, dict]) -> dict[str, object]:
    """Rank every user while the device thread is held, so all of them queue; then let it go."""
    gate = hold_device_thread(eng)
    with ThreadPoolExecutor(len(users)) as pool:
        futures = {u: pool.submit(eng.rank, u, h, CANDS) for u, h in users.items()}
        wait_until(lambda: eng.executor.depth() == len(users), what="every rank to queue")
        gate.set()
        return {u: f.result(30) for u, f in futures.items()}


def test_queued_ranks_from_device_slots_run_as_one_batched_call():
    eng, _ = clocked_engine("relay.max_rank_batch=4")
    try:
        users = {f"u{i}": hist(200 + i) for i in range(3)}
        for u, h in users.items():
            relay(eng, u, h)
        results = queued_ranks(eng, {**users, "cold": hist(300)})  # a user without a pre-infer: a miss
        assert eng.model.batch_calls == [3]  # the three cached ranks in one call; the miss on its own
        for u, h in users.items():
            assert results[u].cache == "device"
            np.testing.assert_array_equal(results[u].scores, eng.model.rank_full(h, CANDS))
        assert results["cold"].cache == "miss"
        assert eng.executor.batch_stats() == {"rank": {4: 1}}  # one device step for all four
    finally:
        eng.close()


def test_an_idle_device_ranks_at_once_and_max_rank_batch_1_never_batches():
    for max_batch in (1, 4):
        eng, _ = clocked_engine(f"relay.max_rank_batch={max_batch}")
        try:
            relay(eng, "alone", hist(400))
            assert eng.rank("alone", hist(400), CANDS).cache == "device"  # nothing queued: a batch of one
            assert eng.executor.batch_stats() == {"rank": {1: 1}} and eng.model.batch_calls == []
            if max_batch == 1:
                users = {f"v{i}": hist(500 + i) for i in range(3)}
                for u, h in users.items():
                    relay(eng, u, h)
                queued_ranks(eng, users)
                assert eng.model.batch_calls == [] and eng.executor.batch_stats() == {"rank": {1: 4}}
        finally:
            eng.close()


def test_queued_ranks_never_run_padded_to_a_bucket_that_costs_more_per_rank():
    """Batch factors as measured on a 2-core CPU (1, 0.92, 0.83 at 1, 2 and 4 users): three queued cached ranks
    padded to four would cost 1.11 single calls each, so the device thread ranks two together and then the
    third; four queued run as one call of four. Every score stays exact."""
    cfg = load_config(CONFIGS / "tiny.yaml", [*BASE, "relay.ready_ttl_ms=1000", "relay.max_rank_batch=4"])
    measured = LatencyModel(latency().points, batch_factors={1: 1.0, 2: 0.92, 4: 0.83})
    for queued, calls, steps in ((3, [2], {1: 1, 2: 1}), (4, [4], {4: 1})):
        eng = RelayEngine(cfg, FakeModel(cfg), measured)
        try:
            users = {f"w{i}": hist(700 + i) for i in range(queued)}
            for u, h in users.items():
                relay(eng, u, h)
            results = queued_ranks(eng, users)
            assert eng.model.batch_calls == calls and eng.executor.batch_stats() == {"rank": steps}
            for u, h in users.items():
                assert results[u].cache == "device"
                np.testing.assert_array_equal(results[u].scores, eng.model.rank_full(h, CANDS))
        finally:
            eng.close()


def test_max_batch_delay_ms_bounds_how_much_later_the_first_rank_finishes():
    """Cached ranks of one shape cost 5 ms alone and, with no batch factors measured, B x 5 ms together: a
    batch of B delays its first rank by (B - 1) x 5 ms. The bound stops the batch there; the rest lead the
    next batches, in order. A miss (200 ms) never joins a cached rank under a 15 ms bound."""
    for bound, expected in ((0, [1, 1, 1, 1]), (5, [2, 2]), (15, [4])):
        eng, _ = clocked_engine("relay.max_rank_batch=4", f"relay.max_batch_delay_ms={bound}")
        try:
            users = {f"u{i}": hist(600 + i) for i in range(4)}
            for u, h in users.items():
                relay(eng, u, h)
            results = queued_ranks(eng, users)
            assert all(r.cache == "device" for r in results.values())
            steps = eng.executor.batch_stats()["rank"]
            assert sorted(steps.items()) == sorted({n: expected.count(n) for n in set(expected)}.items()), bound
            for u, h in users.items():
                np.testing.assert_array_equal(results[u].scores, eng.model.rank_full(h, CANDS))
        finally:
            eng.close()
    eng, _ = clocked_engine("relay.max_rank_batch=4", "relay.max_batch_delay_ms=15")
    try:
        relay(eng, "warm", hist(700))
        results = queued_ranks(eng, {"warm": hist(700), "cold": hist(701)})
        assert (results["warm"].cache, results["cold"].cache) == ("device", "miss")
        assert eng.executor.batch_stats() == {"rank": {1: 2}}
    finally:
        eng.close()


def test_prefills_queued_together_run_their_chunks_in_shared_calls_and_serve_exact_ranks():
    """relay.max_prefill_batch 4: three pre-infers admitted while the device is busy prefill their 32-event chunks
    in shared prefill_batch calls, two at a time (three would pad to the batch bucket of four: a third more work
    for chunks that cost what they would alone), the one left out leading the next call; the shorter histories
    drop out. Each relay is then served from its slot with exact scores."""
    eng, _ = clocked_engine("relay.max_prefill_batch=4", "relay.max_rank_batch=4")
    try:
        gate = hold_device_thread(eng)
        users = {"a": hist(800, 100), "b": hist(801, 70), "c": hist(802, 40)}  # 4, 3 and 2 chunks of 32
        for u, h in users.items():
            assert eng.preinfer(u, h, num_candidates=10).admitted
        gate.set()
        eng.wait_prefills(10)
        assert eng.model.prefill_calls == [2, 2, 2, 2, 1]
        assert eng.executor.batch_stats()["prefill_chunk"] == {1: 1, 2: 4}
        stats = eng.stats().work
        assert (stats.prefills, stats.prefill_chunks, stats.prefill_events) == (3, 9, 210)
        for u, h in users.items():
            result = eng.rank(u, h, CANDS)
            assert result.cache == "device"
            np.testing.assert_array_equal(result.scores, eng.model.rank_full(h, CANDS))
    finally:
        eng.close()


def test_with_max_prefill_batch_1_every_chunk_is_its_own_call():
    eng, _ = clocked_engine()
    try:
        relay(eng, "solo", hist(810, 70))
        assert eng.model.prefill_calls == [1, 1, 1] and "prefill_chunk" not in eng.executor.batch_stats()
    finally:
        eng.close()


def test_a_failed_batched_prefill_call_drops_every_relay_of_the_batch_and_frees_their_slots():
    """A prefill_batch call that raises reaches each relay of the batch: each is dropped as failed (counted), its
    slot freed, and the users' ranks then take the full path with exact scores."""
    eng, _ = clocked_engine("relay.max_prefill_batch=4")
    try:
        gate = hold_device_thread(eng)

        def broken(chunks):
            raise RuntimeError("device fault")

        eng.model.prefill_batch = broken
        users = {"a": hist(820, 70), "b": hist(821, 40)}
        for u, h in users.items():
            assert eng.preinfer(u, h, num_candidates=10).admitted
        gate.set()
        eng.wait_prefills(10)
        assert eng.stats().work.prefill_errors == 2
        assert eng.ledger.footprint().inflight == 0
        for u, h in users.items():
            result = eng.rank(u, h, CANDS)
            assert result.cache == "miss"
            np.testing.assert_array_equal(result.scores, eng.model.rank_full(h, CANDS))
    finally:
        eng.close()
