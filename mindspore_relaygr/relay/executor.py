"""One thread that owns every device call of an engine (MindSpore calls must never overlap).

Callers on any thread submit work and wait on futures. Ranking work has priority over prefills,
and a prefill is a sequence of steps (chunks): between two steps the thread runs every waiting
rank, so a rank waits at most one chunk behind a prefill.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

logger = logging.getLogger(__name__)

RANK, PREFILL = 0, 1  # lower runs first


class ExecutorClosed(RuntimeError):
    """Work was submitted to (or left in) a closed executor."""


class DeviceExecutor:
    """A priority queue drained by one daemon thread; `close()` joins it."""

    def __init__(self, name: str = "relaygr-device") -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._closed = False
        self._busy_since: float | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], priority: int = RANK) -> Future:
        """Run `fn()` on the device thread; its result or exception lands in the future."""
        return self._put(priority, _Call(fn))

    def submit_steps(self, steps: Iterator[Any], priority: int = PREFILL) -> Future:
        """Run a generator one step at a time, yielding the thread to higher-priority work in between.

        The future gets the generator's return value (StopIteration.value).
        """
        return self._put(priority, _Steps(steps))

    def depth(self) -> int:
        """Tasks waiting (not counting the one running)."""
        return self._queue.qsize()

    def busy_ms(self) -> float:
        """How long the running task has been running (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else (time.perf_counter() - since) * 1e3

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting work, finish what is queued, join the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put((99, next(self._seq), None, None))
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("device thread did not stop within %.0f s", timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _put(self, priority: int, task: _Task) -> Future:
        if self._closed:
            raise ExecutorClosed("the device executor is closed")
        future: Future = Future()
        self._queue.put((priority, next(self._seq), task, future))
        return future

    def _run(self) -> None:
        while True:
            priority, seq, task, future = self._queue.get()
            if task is None:
                break
            if not isinstance(task, _Resumed) and not future.set_running_or_notify_cancel():
                continue  # cancelled before it started
            self._busy_since = time.perf_counter()
            try:
                done, value = task.step()
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiting caller
                future.set_exception(exc)
                continue
            finally:
                self._busy_since = None
            if done:
                future.set_result(value)
            else:
                # Same priority and original sequence number: it stays ahead of later prefills,
                # but every rank queued meanwhile runs first.
                self._queue.put((priority, seq, _Resumed(task), future))
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                _, _, task, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future is not None and not future.done():
                future.set_exception(ExecutorClosed("the device executor closed before this ran"))


class _Task:
    def step(self) -> tuple[bool, Any]:
        raise NotImplementedError


class _Call(_Task):
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def step(self) -> tuple[bool, Any]:
        return True, self.fn()


class _Steps(_Task):
    def __init__(self, steps: Iterator[Any]) -> None:
        self.steps = steps

    def step(self) -> tuple[bool, Any]:
        try:
            next(self.steps)
        except StopIteration as stop:
            return True, stop.value
        return False, None


class _Resumed(_Task):
    """A re-queued step task (a distinct object so a cancelled future is not re-checked)."""

    def __init__(self, inner: _Task) -> None:
        self.inner = inner

    def step(self) -> tuple[bool, Any]:
        return self.inner.step()
