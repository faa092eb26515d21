"""DeviceExecutor: one thread, ranks before prefill steps, close() leaves no thread behind."""

from __future__ import annotations

import threading
import time

import pytest

from mindspore_relaygr.relay.executor import PREFILL, RANK, DeviceExecutor, ExecutorClosed


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
    gate = threading.Event()

    def prefill():
        for chunk in range(5):
            if chunk == 1:
                gate.set()  # the rank below is submitted while chunk 1 runs
                time.sleep(0.05)
            order.append(f"chunk{chunk}")
            yield
        return "prefilled"

    pre = ex.submit_steps(prefill(), PREFILL)
    gate.wait(5)
    rank = ex.submit(lambda: order.append("rank") or "ranked", RANK)
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


def test_close_fails_queued_work_and_refuses_new_work():
    ex = DeviceExecutor()
    release = threading.Event()
    running = ex.submit(lambda: release.wait(5))
    queued = ex.submit(lambda: "never")
    closer = threading.Thread(target=ex.close)
    closer.start()
    release.set()
    closer.join(10)
    assert running.result(1) is True
    assert queued.result(1) == "never" or isinstance(queued.exception(1), ExecutorClosed)
    with pytest.raises(ExecutorClosed):
        ex.submit(lambda: 1)
    assert not ex.alive
