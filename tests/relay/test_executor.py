"""DeviceExecutor: one thread, ranks before prefill steps, close() leaves no thread behind."""

from __future__ import annotations

import threading

import pytest

from mindspore_relaygr.relay.executor import PREFILL, RANK, DeviceExecutor, ExecutorClosed, Outcome
from tests.waiting import wait_until


def test_results_exceptions_and_a_single_thread():
    ex = DeviceExecutor()
    threads = set()
    futures = [ex.submit(lambda i=i: threads.add(threading.get_ident()) or i * i) for i in range(20)]
    assert [f.result(5) for f in futures] == [i * i for i in range(20)]
    assert len(threads) == 1 and threading.get_ident() not in threads
    with pytest.raises(ZeroDivisionError):
        ex.submit(lambda: 1 / 0).result(5)
    ex.close()
    assert not ex.alive


def test_a_rank_submitted_during_a_long_prefill_runs_between_its_chunks():
    ex = DeviceExecutor()
    order = []
    running, submitted = threading.Event(), threading.Event()

    def prefill():
        for chunk in range(5):
            if chunk == 1:
                running.set()
                assert submitted.wait(5)  # chunk 1 ends only once the rank below is queued
            order.append(f"chunk{chunk}")
            yield
        return "prefilled"

    pre = ex.submit_steps(prefill(), PREFILL)
    assert running.wait(5)
    rank = ex.submit(lambda: order.append("rank") or "ranked", RANK)
    submitted.set()
    assert rank.result(5) == "ranked" and pre.result(5) == "prefilled"
    assert order.index("rank") == 2  # after the chunk that was running, before the next one
    assert order[-1] == "chunk4"
    ex.close()


def test_earlier_prefill_stays_ahead_of_later_ones():
    ex = DeviceExecutor()
    block = threading.Event()
    order = []
    ex.submit(lambda: block.wait(5))

    def job(name):
        for i in range(3):
            order.append(f"{name}{i}")
            yield

    a, b = ex.submit_steps(job("a")), ex.submit_steps(job("b"))
    block.set()
    a.result(5), b.result(5)
    assert order == ["a0", "a1", "a2", "b0", "b1", "b2"]
    ex.close()


def test_close_finishes_queued_work_and_refuses_new_work():
    ex = DeviceExecutor()
    release = threading.Event()
    running = ex.submit(lambda: release.wait(5))
    queued = ex.submit(lambda: "ran")
    closer = threading.Thread(target=ex.close)
    closer.start()
    wait_until(lambda: ex.closed, what="close() to begin")  # `queued` is still waiting behind `running`
    with pytest.raises(ExecutorClosed):
        ex.submit(lambda: 1)
    release.set()
    closer.join(10)
    assert running.result(1) is True and queued.result(1) == "ran"
    assert not ex.alive


def _job(order, name, steps=3):
    for i in range(steps):
        order.append(f"{name}{i}")
        yield
    return name


def test_boost_moves_a_queued_prefill_ahead_of_earlier_prefills_and_later_ranks():
    ex = DeviceExecutor()
    block, running, order = threading.Event(), threading.Event(), []
    ex.submit(lambda: running.set() or block.wait(5))
    running.wait(5)
    a, b = ex.submit_steps(_job(order, "a")), ex.submit_steps(_job(order, "b"))
    rank = ex.submit(lambda: order.append("rank"), RANK)
    assert ex.boost(b) is True
    assert ex.depth() == 3  # the stale entry of b is not counted
    block.set()
    assert (a.result(5), b.result(5), rank.result(5)) == ("a", "b", None)
    # b keeps its submission order (before the rank) at rank priority; a is still a prefill
    assert order == ["b0", "b1", "b2", "rank", "a0", "a1", "a2"]
    ex.close()


def test_boost_of_a_running_prefill_keeps_later_ranks_behind_its_remaining_steps():
    ex = DeviceExecutor()
    order, started, go = [], threading.Event(), threading.Event()

    def prefill():
        for i in range(3):
            if i == 0:
                started.set()
                go.wait(5)
            order.append(f"p{i}")
            yield
        return "done"

    pre = ex.submit_steps(prefill())
    started.wait(5)
    rank = ex.submit(lambda: order.append("rank"), RANK)
    assert ex.boost(pre) is True
    go.set()
    assert pre.result(5) == "done" and rank.result(5) is None
    assert order == ["p0", "p1", "p2", "rank"]
    assert ex.boost(pre) is False  # finished
    ex.close()


def test_boost_is_refused_for_rank_work_and_unknown_futures():
    ex = DeviceExecutor()
    block = threading.Event()
    ex.submit(lambda: block.wait(5))
    queued_rank = ex.submit(lambda: 1, RANK)
    assert ex.boost(queued_rank) is False
    from concurrent.futures import Future

    assert ex.boost(Future()) is False
    block.set()
    assert queued_rank.result(5) == 1
    ex.close()


def test_step_stats_count_steps_per_label_and_keep_the_longest():
    now = [0.0]
    ex = DeviceExecutor(clock=lambda: now[0])

    def advance(seconds: float) -> None:
        now[0] += seconds

    ex.submit(lambda: advance(0.03), label="slow").result(5)
    ex.submit(lambda: advance(0.001), label="fast").result(5)
    ex.submit(lambda: advance(0.01), label="fast").result(5)
    ex.submit_steps(_job([], "x", steps=2), label="prefill").result(5)
    stats = ex.step_stats()
    assert stats["slow"] == {"steps": 1, "max_ms": pytest.approx(30.0)}
    assert stats["fast"] == {"steps": 2, "max_ms": pytest.approx(10.0)}  # the longer of its two steps
    assert stats["prefill"]["steps"] == 3  # two yields and the final step that returns
    ex.reset_stats()
    assert ex.step_stats() == {}
    ex.close()


class Recorder:
    """A batched run function: records each batch's items, answers each item with its square."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def run(self, items: list[int]) -> list[Outcome]:
        self.batches.append(list(items))
        return [Outcome(error=ValueError(f"bad {i}")) if i < 0 else Outcome(i * i) for i in items]


def test_an_idle_device_runs_a_batched_item_at_once_alone():
    ex, rec = DeviceExecutor(), Recorder()
    assert ex.submit_batched(3, rec.run, max_batch=8, label="rank").result(5) == 9
    assert rec.batches == [[3]] and ex.batch_stats() == {"rank": {1: 1}}
    ex.close()


def test_items_queued_behind_the_first_join_its_batch_up_to_max_batch_in_order():
    ex, rec = DeviceExecutor(), Recorder()
    gate, running = threading.Event(), threading.Event()
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    futures = [ex.submit_batched(i, rec.run, max_batch=4, label="rank") for i in range(6)]
    gate.set()
    assert [f.result(5) for f in futures] == [i * i for i in range(6)]
    assert rec.batches == [[0, 1, 2, 3], [4, 5]]
    assert ex.batch_stats() == {"rank": {2: 1, 4: 1}} and ex.step_stats()["rank"]["steps"] == 2
    ex.close()


def test_batch_size_runs_part_of_the_gathered_batch_and_the_rest_lead_the_next_in_order():
    """`batch_size(n)` of the first item picks how many of the n gathered run now; the others go back to their
    places, ahead of what was queued after them; an error in it runs the batch as gathered."""
    ex, rec = DeviceExecutor(), Recorder()
    gate, running = threading.Event(), threading.Event()
    asked: list[int] = []

    def two_at_most(n: int) -> int:
        asked.append(n)
        if n == 1:
            raise RuntimeError("boom")  # never asked with 1: a lone item needs no choice
        return 2 if n > 2 else n

    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    futures = [ex.submit_batched(i, rec.run, max_batch=4, label="rank", batch_size=two_at_most) for i in range(7)]
    gate.set()
    assert [f.result(5) for f in futures] == [i * i for i in range(7)]
    assert rec.batches == [[0, 1], [2, 3], [4, 5], [6]]
    assert asked == [4, 4, 3]
    assert ex.batch_stats() == {"rank": {1: 1, 2: 3}} and ex.depth() == 0

    def broken(n: int) -> int:
        raise RuntimeError("boom")

    running.clear()
    gate.clear()
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    rec.batches.clear()
    futures = [ex.submit_batched(i, rec.run, max_batch=4, batch_size=broken) for i in range(3)]
    gate.set()
    assert [f.result(5) for f in futures] == [0, 1, 4] and rec.batches == [[0, 1, 2]]
    ex.close()


def test_may_join_ends_a_batch_and_the_refused_item_leads_the_next():
    """The first item's `may_join` sees the batch so far plus the candidate; a refusal ends the batch there, order
    kept; an error in it ends the batch too and the thread goes on."""
    ex, rec = DeviceExecutor(), Recorder()
    gate, running = threading.Event(), threading.Event()
    seen: list[list[int]] = []

    def at_most_sum_5(items: list[int]) -> bool:
        seen.append(list(items))
        if 99 in items:
            raise RuntimeError("forecast failed")
        return sum(items) <= 5

    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    items = [1, 2, 3, 4, 99, 0]
    futures = [ex.submit_batched(i, rec.run, max_batch=8, label="rank", may_join=at_most_sum_5) for i in items]
    gate.set()
    assert [f.result(5) for f in futures] == [i * i for i in items]
    # 1+2 fits, 1+2+3 does not; 3 leads: 3+4 does not; 4 leads: 4+99 fails; 99 leads: 99+0 fails
    assert rec.batches == [[1, 2], [3], [4], [99], [0]]
    assert seen[:3] == [[1, 2], [1, 2, 3], [3, 4]]
    ex.close()


def test_a_batch_stops_at_other_work_and_keeps_priorities():
    """A prefill boosted to rank priority between two ranks ends the first batch (order is kept); a prefill
    at its own priority never joins, and waits for every rank."""
    ex, rec = DeviceExecutor(), Recorder()
    gate, running, order = threading.Event(), threading.Event(), []
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    a = ex.submit_batched(1, rec.run, max_batch=8)
    boosted = ex.submit_steps(_job(order, "b", steps=1))
    later_prefill = ex.submit_steps(_job(order, "p", steps=1))
    c, d = ex.submit_batched(2, rec.run, max_batch=8), ex.submit_batched(3, rec.run, max_batch=8)
    assert ex.boost(boosted)
    gate.set()
    assert (a.result(5), c.result(5), d.result(5), later_prefill.result(5)) == (1, 4, 9, "p")
    assert rec.batches == [[1], [2, 3]] and order == ["b0", "p0"]
    ex.close()


def test_each_item_gets_its_own_outcome_and_a_failing_run_fails_them_all():
    ex, rec = DeviceExecutor(), Recorder()
    gate, running = threading.Event(), threading.Event()
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    good, bad = ex.submit_batched(2, rec.run, max_batch=4), ex.submit_batched(-1, rec.run, max_batch=4)

    def broken(items):
        raise RuntimeError("device lost")

    lost = [ex.submit_batched(i, broken, max_batch=4) for i in range(2)]
    gate.set()
    assert good.result(5) == 4
    with pytest.raises(ValueError, match="bad -1"):
        bad.result(5)
    for f in lost:
        with pytest.raises(RuntimeError, match="device lost"):
            f.result(5)
    assert ex.depth() == 0
    ex.close()


def _requests(name: str, chunks: int, log: list, catch: bool = False):
    """A generator asking for `chunks` device calls (payload (name, i)), logging what each returned."""
    from mindspore_relaygr.relay.executor import DeviceRequest

    got = []
    for i in range(chunks):
        try:
            got.append((yield DeviceRequest((name, i))))
        except RuntimeError as exc:
            if not catch:
                raise
            got.append(f"error {exc}")
        log.append(f"{name}{i}")
    return got


def _held_executor_with_recorded_calls():
    """An executor whose thread is held until `gate` is set, and a run function answering "name:i" per payload
    that records each call's payloads in `calls`."""
    ex, calls, log = DeviceExecutor(), [], []

    def run(payloads):
        calls.append(list(payloads))
        return [Outcome(f"{n}:{i}") for n, i in payloads]

    gate, running = threading.Event(), threading.Event()
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    return ex, calls, log, run, gate


def test_request_generators_queued_together_share_device_calls_and_get_their_own_results():
    ex, calls, log, run, gate = _held_executor_with_recorded_calls()
    a = ex.submit_batched_steps(_requests("a", 2, log), run, max_batch=4, label="prefill")
    b = ex.submit_batched_steps(_requests("b", 3, log), run, max_batch=4, label="prefill")
    c = ex.submit_batched_steps(_requests("c", 1, log), run, max_batch=2, label="prefill")  # its own max: led by a
    gate.set()
    assert a.result(5) == ["a:0", "a:1"] and b.result(5) == ["b:0", "b:1", "b:2"] and c.result(5) == ["c:0"]
    assert calls[0] == [("a", 0), ("b", 0), ("c", 0)]  # first's max_batch (4) rules the batch
    assert calls[1:] == [[("a", 1), ("b", 1)], [("b", 2)]]
    assert ex.batch_stats()["prefill"] == {1: 1, 2: 1, 3: 1} and ex.depth() == 0
    ex.close()


def test_request_generators_left_out_by_batch_size_keep_their_requests_for_the_next_call():
    ex, calls, log, run, gate = _held_executor_with_recorded_calls()
    gens = [ex.submit_batched_steps(_requests(name, 1, log), run, max_batch=4, label="prefill",
                                    batch_size=lambda n: 2 if n >= 2 else 1) for name in "abc"]
    gate.set()
    assert [g.result(5) for g in gens] == [["a:0"], ["b:0"], ["c:0"]]
    assert calls == [[("a", 0), ("b", 0)], [("c", 0)]]  # c ran its own request once, in the next call
    assert ex.batch_stats()["prefill"] == {1: 1, 2: 1} and ex.depth() == 0
    ex.close()


def test_a_rank_runs_between_two_batched_chunks_and_a_failed_call_reaches_every_generator():
    ex, order, ranks = DeviceExecutor(), [], []

    def run(payloads):
        order.append(("run", [p[0] for p in payloads]))
        if payloads[0][1] == 0:  # a rank arrives while the first chunks compute
            ranks.append(ex.submit(lambda: order.append(("rank",)), RANK))
            return [Outcome(p) for p in payloads]
        raise RuntimeError("device lost")

    gate, running = threading.Event(), threading.Event()
    ex.submit(lambda: running.set() or gate.wait(5))
    assert running.wait(5)
    caught = ex.submit_batched_steps(_requests("x", 2, [], catch=True), run, max_batch=4)
    failed = ex.submit_batched_steps(_requests("y", 2, []), run, max_batch=4)
    gate.set()
    assert caught.result(5) == [("x", 0), "error device lost"]
    with pytest.raises(RuntimeError, match="device lost"):
        failed.result(5)
    ranks[0].result(5)
    assert order == [("run", ["x", "y"]), ("rank",), ("run", ["x", "y"])]
    assert ex.depth() == 0
    ex.close()
