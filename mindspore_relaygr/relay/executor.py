"""One thread that owns every device call of an engine (MindSpore calls must never overlap).

Callers on any thread submit work and wait on futures. Ranking work has priority over prefills,
and a prefill is a sequence of steps (chunks): between two steps the thread runs every waiting
rank, so a rank waits at most one chunk behind a prefill. A rank that needs a prefill's result
`boost`s it to rank priority, so other ranks and later prefills no longer run ahead of it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

RANK, PREFILL, AUDIT = 0, 1, 2  # lower runs first; AUDIT runs only when nothing else waits


class ExecutorClosed(RuntimeError):
    """Work was submitted to (or left in) a closed executor."""


class DeviceExecutor:
    """A priority queue drained by one daemon thread; `close()` joins it."""

    def __init__(self, name: str = "relaygr-device", clock: Callable[[], float] = time.perf_counter) -> None:
        """`clock` (seconds) times the steps (step_stats, busy_ms)."""
        self._clock = clock
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._closed = False
        self._busy_since: float | None = None
        self._steps: dict[str, tuple[int, float]] = {}  # label -> (steps, longest step ms)
        self._batches: dict[str, dict[int, int]] = {}  # label -> batch size -> device calls
        self._lock = threading.Lock()  # guards _live, _running and task tickets/priorities
        self._live: dict[Future, _Task] = {}  # submitted, not finished
        self._running: _Task | None = None
        self._running_with: int = 0  # further tasks running in the same batch as _running
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], priority: int = RANK, label: str = "call") -> Future:
        """Run `fn()` on the device thread; its result or exception lands in the future."""
        return self._put(priority, _Call(fn, label))

    def submit_batched(self, item: Any, run: Callable[[list[Any]], list[Outcome]], max_batch: int,
                       priority: int = RANK, label: str = "batch",
                       may_join: Callable[[list[Any]], bool] | None = None,
                       batch_size: Callable[[int], int] | None = None) -> Future:
        """Run `item` on the device thread together with the items queued right behind it that were submitted
        with the same `run` and priority: one `run(items)` call for up to `max_batch` of them, which returns
        one Outcome per item, in order. The batch is formed from what is already queued when the first item
        comes up: the thread never waits for more to arrive. `may_join(items)` (the first item's; items = the
        batch so far and the next candidate) can stop the batch before `max_batch`, e.g. to bound how much
        a larger batch delays its first member; the candidate then leads the next batch. `batch_size(n)` (the
        first item's) then says how many of the n gathered run in this call (1..n, e.g. to avoid padding to a
        larger batch bucket); the rest go back to the queue at their places and lead the next call."""
        return self._put(priority, _Batched(item, run, max_batch, label, may_join, batch_size))

    def submit_steps(self, steps: Iterator[Any], priority: int = PREFILL, label: str = "steps") -> Future:
        """Run a generator one step at a time, yielding the thread to higher-priority work in between.

        The future gets the generator's return value (StopIteration.value).
        """
        return self._put(priority, _Steps(steps, label))

    def submit_batched_steps(self, steps: Iterator[Any], run: Callable[[list[Any]], list[Outcome]], max_batch: int,
                             priority: int = PREFILL, label: str = "steps",
                             batch_size: Callable[[int], int] | None = None) -> Future:
        """`submit_steps` for a generator whose device work comes as requests: it yields `DeviceRequest(payload)`
        where it needs the device, and receives the result (or has the error thrown in). When its request comes
        up, the thread takes the generators queued right behind it with the same `run` and priority, runs each to
        its next request (their host work) and calls `run(payloads)` once for up to `max_batch` of them, which
        returns one Outcome per payload, in order. Any other yield is a step boundary, as in `submit_steps`.
        `batch_size` as in `submit_batched`: the generators left out keep their requests for the next call."""
        return self._put(priority, _BatchedSteps(steps, run, max_batch, label, batch_size))

    def step_stats(self) -> dict[str, dict[str, float]]:
        """Per task label: steps run and the longest single step (ms) since the last reset: what a
        rank queued behind that kind of work could have waited."""
        return {label: {"steps": n, "max_ms": worst} for label, (n, worst) in sorted(self._steps.items())}

    def batch_stats(self) -> dict[str, dict[int, int]]:
        """Per label of batched work: how many device calls ran each batch size, since the last reset."""
        return {label: dict(sorted(sizes.items())) for label, sizes in sorted(self._batches.items())}

    def reset_stats(self) -> None:
        self._steps.clear()
        self._batches.clear()

    def depth(self) -> int:
        """Tasks waiting (not counting the one running)."""
        with self._lock:
            return len(self._live) - (self._running is not None) - self._running_with

    def busy_ms(self) -> float:
        """How long the running task has been running (0 when idle)."""
        since = self._busy_since
        return 0.0 if since is None else (self._clock() - since) * 1e3

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting work, finish what is queued, join the thread."""
        if self._closed:
            return
        self._closed = True
        self._queue.put((99, next(self._seq), 0, None, None))
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("device thread did not stop within %.0f s", timeout)

    @property
    def closed(self) -> bool:
        """True once `close()` has begun: new work is refused from then on."""
        return self._closed

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def boost(self, future: Future, priority: int = RANK) -> bool:
        """Run the rest of `future`'s task at `priority` (priority inheritance: a rank that waits on a
        prefill makes that prefill rank work). Its place among tasks of the new priority is its
        original submission order. False if the task already finished or runs at that priority."""
        with self._lock:
            task = self._live.get(future)
            if task is None or task.priority <= priority:
                return False
            task.priority = priority
            if task is not self._running:
                self._enqueue(task, future)  # the entry at the old priority goes stale
        return True

    def _put(self, priority: int, task: _Task) -> Future:
        if self._closed:
            raise ExecutorClosed("the device executor is closed")
        future: Future = Future()
        task.priority, task.seq = priority, next(self._seq)
        with self._lock:
            self._live[future] = task
            self._enqueue(task, future)
        return future

    def _enqueue(self, task: _Task, future: Future) -> None:
        """Queue `task` at its priority; any entry queued for it before is stale from now on."""
        task.ticket += 1
        self._queue.put((task.priority, task.seq, task.ticket, task, future))

    def _next(self) -> tuple[_Task | None, Future | None]:
        while True:
            _, _, ticket, task, future = self._queue.get()
            if task is None:
                return None, None
            with self._lock:
                if ticket != task.ticket:
                    continue  # superseded by a boost
                self._running = task
            if task.started or future.set_running_or_notify_cancel():
                task.started = True
                return task, future
            self._finish(future)  # cancelled before it started

    def _finish(self, future: Future) -> None:
        with self._lock:
            self._live.pop(future, None)
            self._running = None

    def _queued_behind(self, matches: Callable[[_Task], bool]) -> Iterator[tuple[Any, Future]]:
        """The tasks queued right behind the running one that `matches` accepts, taken off the queue in order
        (stale entries skipped, cancelled tasks dropped); it stops at the first one it does not accept, which
        goes back, and takes nothing more once the caller stops iterating."""
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return
            _, _, ticket, task, future = entry
            with self._lock:
                stale = task is not None and ticket != task.ticket
            if stale:
                continue  # superseded by a boost
            if not matches(task):
                self._queue.put(entry)
                return
            if task.started or future.set_running_or_notify_cancel():
                task.started = True
                yield task, future
            else:
                with self._lock:
                    self._live.pop(future, None)

    def _batch_behind(self, first: _Batched) -> list[tuple[_Batched, Future]]:
        """The tasks queued right behind `first` that join its batch (same run function and priority), taken
        off the queue; stops at the first entry that does not match (it goes back), so order is kept."""
        members: list[tuple[_Batched, Future]] = []
        if first.max_batch > 1:
            for member in self._queued_behind(lambda task: _joins(first, [m for m, _ in members], task)):
                members.append(member)
                if len(members) + 1 >= first.max_batch:
                    break
            members = self._keep(first, members)
        with self._lock:
            self._running_with = len(members)
        return members

    def _keep(self, first: _Batched | _BatchedSteps, members: list[tuple[Any, Future]]) -> list[tuple[Any, Future]]:
        """The members that run with `first` as its `batch_size` chooses; the others go back to the queue at
        their places (their sequence numbers), ahead of anything queued after them."""
        if first.batch_size is None or not members:
            return members
        try:
            size = int(first.batch_size(len(members) + 1))
        except Exception:  # noqa: BLE001 - the batch as gathered is always safe
            logger.exception("batch_size failed; the batch runs as gathered")
            return members
        size = min(max(size, 1), len(members) + 1)
        with self._lock:
            for task, future in members[size - 1:]:
                self._enqueue(task, future)
        return members[: size - 1]

    def _run_batch(self, first: _Batched, future: Future) -> None:
        """One device call for `first` and the tasks queued behind it; each future gets its own outcome."""
        batch = [(first, future), *self._batch_behind(first)]
        sizes = self._batches.setdefault(first.label, {})
        sizes[len(batch)] = sizes.get(len(batch), 0) + 1
        try:
            outcomes = first.run([task.item for task, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} returned {len(outcomes)} outcomes")
        except BaseException as exc:  # noqa: BLE001 - delivered to every waiting caller
            outcomes = [Outcome(error=exc)] * len(batch)
        with self._lock:
            for _, f in batch:
                self._live.pop(f, None)
            self._running, self._running_with = None, 0
        for (_, f), outcome in zip(batch, outcomes, strict=True):
            if outcome.error is not None:
                f.set_exception(outcome.error)
            else:
                f.set_result(outcome.value)

    def _advance(self, task: _BatchedSteps, future: Future) -> bool:
        """Run `task` to its next request; False when it finished, failed (its future says which) or reached a
        plain step boundary (it is queued again)."""
        try:
            done, value = task.advance()
        except BaseException as exc:  # noqa: BLE001 - delivered to the waiting caller
            self._finish(future)
            future.set_exception(exc)
            return False
        if done:
            self._finish(future)
            future.set_result(value)
            return False
        if task.pending is None:
            self._requeue(task, future)
            return False
        return True

    def _requeue(self, task: _Task, future: Future) -> None:
        """Back in the queue at its original sequence number: every rank queued meanwhile runs first."""
        with self._lock:
            if self._running is task:
                self._running = None
            self._enqueue(task, future)

    def _run_batched_steps(self, first: _BatchedSteps, future: Future) -> None:
        """One device call for the pending requests of `first` and of the request generators queued behind it."""
        if first.pending is None and not self._advance(first, future):
            return
        batch = [(first, future)]
        if first.max_batch > 1:
            def same(task: _Task) -> bool:
                return isinstance(task, _BatchedSteps) and task.run == first.run and task.priority == first.priority

            for task, other in self._queued_behind(same):
                if task.pending is not None or self._advance(task, other):
                    batch.append((task, other))
                if len(batch) >= first.max_batch:
                    break
            batch = [batch[0], *self._keep(first, batch[1:])]
        sizes = self._batches.setdefault(first.label, {})
        sizes[len(batch)] = sizes.get(len(batch), 0) + 1
        with self._lock:
            self._running_with = len(batch) - 1
        try:
            outcomes = first.run([task.pending for task, _ in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} returned {len(outcomes)} outcomes")
        except BaseException as exc:  # noqa: BLE001 - thrown into every generator of the batch
            outcomes = [Outcome(error=exc)] * len(batch)
        with self._lock:
            self._running_with = 0
        for (task, f), outcome in zip(batch, outcomes, strict=True):
            task.pending, task.inbox = None, outcome
            self._requeue(task, f)

    def _run(self) -> None:
        while True:
            task, future = self._next()
            if task is None:
                break
            if isinstance(task, (_Batched, _BatchedSteps)):
                self._busy_since = start = self._clock()
                try:
                    if isinstance(task, _Batched):
                        self._run_batch(task, future)
                    else:
                        self._run_batched_steps(task, future)
                finally:
                    self._busy_since = None
                    self._count_step(task.label, (self._clock() - start) * 1e3)
                continue
            self._busy_since = start = self._clock()
            try:
                done, value = task.step()
            except BaseException as exc:  # noqa: BLE001 - delivered to the waiting caller
                self._finish(future)
                future.set_exception(exc)
                continue
            finally:
                self._busy_since = None
                self._count_step(task.label, (self._clock() - start) * 1e3)
            if done:
                self._finish(future)
                future.set_result(value)
            else:
                # Original sequence number: it stays ahead of later work of its priority, but every
                # rank queued meanwhile runs first (unless the task was boosted to rank priority).
                with self._lock:
                    self._running = None
                    self._enqueue(task, future)
        self._drain()

    def _count_step(self, label: str, ms: float) -> None:
        steps, worst = self._steps.get(label, (0, 0.0))
        self._steps[label] = (steps + 1, max(worst, ms))

    def _drain(self) -> None:
        while True:
            try:
                _, _, _, task, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future is not None and not future.done():
                future.set_exception(ExecutorClosed("the device executor closed before this ran"))


@dataclass(frozen=True)
class Outcome:
    """What a batched run gives one of its items: a value, or the error that item's caller gets."""

    value: Any = None
    error: BaseException | None = None


class _Task:
    """A unit of device work. `ticket` names its one valid queue entry (a boost re-queues it)."""

    label = "task"

    def __init__(self, label: str) -> None:
        self.label = label
        self.priority, self.seq, self.ticket, self.started = PREFILL, 0, 0, False

    def step(self) -> tuple[bool, Any]:
        raise NotImplementedError


class _Call(_Task):
    def __init__(self, fn: Callable[[], Any], label: str) -> None:
        super().__init__(label)
        self.fn = fn

    def step(self) -> tuple[bool, Any]:
        return True, self.fn()


class _Steps(_Task):
    def __init__(self, steps: Iterator[Any], label: str) -> None:
        super().__init__(label)
        self.steps = steps

    def step(self) -> tuple[bool, Any]:
        try:
            next(self.steps)
        except StopIteration as stop:
            return True, stop.value
        return False, None


@dataclass(frozen=True)
class DeviceRequest:
    """Yielded by a generator of `DeviceExecutor.submit_batched_steps`: device work it needs (`payload`)."""

    payload: Any


class _BatchedSteps(_Task):
    """A generator whose device work comes as DeviceRequests, run in batches by the device thread."""

    def __init__(self, steps: Iterator[Any], run: Callable[[list[Any]], list[Outcome]], max_batch: int,
                 label: str, batch_size: Callable[[int], int] | None = None) -> None:
        super().__init__(label)
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch!r}: must be >= 1")
        self.steps, self.run, self.max_batch, self.batch_size = steps, run, max_batch, batch_size
        self.pending: Any = None  # the payload of the request it waits on
        self.inbox: Outcome | None = None  # the outcome of its last request, not yet sent in

    def advance(self) -> tuple[bool, Any]:
        """Resume the generator with its last outcome up to its next yield: (True, its return value) when it
        ends, else (False, None) with `pending` set if it yielded a request."""
        inbox, self.inbox = self.inbox, None
        try:
            if inbox is None:
                out = next(self.steps)
            elif inbox.error is not None:
                out = self.steps.throw(inbox.error)
            else:
                out = self.steps.send(inbox.value)
        except StopIteration as stop:
            return True, stop.value
        self.pending = out.payload if isinstance(out, DeviceRequest) else None
        return False, None

    def step(self) -> tuple[bool, Any]:  # never called: the thread runs these through _run_batched_steps
        raise NotImplementedError


def _joins(first: _Batched, members: list[_Batched], task: _Task) -> bool:
    """Whether `task` joins the batch of `first` and `members`: same run function and priority, and the
    first item's `may_join` agrees (an error there ends the batch: it must not stop the thread)."""
    if not (isinstance(task, _Batched) and task.run == first.run and task.priority == first.priority):
        return False
    if first.may_join is None:
        return True
    try:
        return bool(first.may_join([first.item, *(m.item for m in members), task.item]))
    except Exception:  # noqa: BLE001 - a batch of what it has so far is always safe
        logger.exception("may_join failed; the batch runs without the next item")
        return False


class _Batched(_Task):
    def __init__(self, item: Any, run: Callable[[list[Any]], list[Outcome]], max_batch: int, label: str,
                 may_join: Callable[[list[Any]], bool] | None = None,
                 batch_size: Callable[[int], int] | None = None) -> None:
        super().__init__(label)
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch!r}: must be >= 1")
        self.item, self.run, self.max_batch, self.may_join = item, run, max_batch, may_join
        self.batch_size = batch_size

    def step(self) -> tuple[bool, Any]:  # never called: the thread runs batches through _run_batch
        raise NotImplementedError
