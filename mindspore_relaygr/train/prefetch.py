"""Build the next training batches on a host thread while the graph runs the current one (numpy only).

The producer thread only runs the iterator (numpy work); MindSpore stays on the caller's thread. Items come
out in the iterator's order, so a seeded epoch is the same with or without prefetching; an exception in the
iterator is raised in the caller at the item where it happened.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Yield `items` in order while a daemon thread builds up to `depth` of them ahead.

    Leaving the loop early (break, exception) stops the thread after the item it is building."""
    if depth < 1:
        raise ValueError(f"prefetch depth must be >= 1, got {depth}")
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ready.put(_DONE)
        except BaseException as error:  # noqa: BLE001 - re-raised in the consumer
            ready.put(_Failure(error))

    worker = threading.Thread(target=produce, name="batch-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        worker.join()
