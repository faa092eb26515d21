"""Prefetching on a host thread keeps the order, re-raises the producer's error, and stops on an early exit."""

from __future__ import annotations

import threading

import pytest

from mindspore_relaygr.train.prefetch import prefetched


def test_items_come_out_in_order_and_all_of_them() -> None:
    assert list(prefetched(iter(range(100)), depth=3)) == list(range(100))
    assert list(prefetched([])) == []


def test_the_producers_error_is_raised_where_it_happened() -> None:
    def items():
        yield 1
        yield 2
        raise KeyError("user 7")

    got = []
    with pytest.raises(KeyError, match="user 7"):
        for item in prefetched(items()):
            got.append(item)
    assert got == [1, 2]


def test_leaving_early_stops_the_thread() -> None:
    built = []

    def items():
        for i in range(1000):
            built.append(i)
            yield i

    for item in prefetched(items(), depth=2):
        if item == 5:
            break
    assert not [t for t in threading.enumerate() if t.name == "batch-prefetch"]
    assert len(built) <= 5 + 1 + 2 + 1  # consumed, the queue (depth 2) and the one being handed over


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1"):
        list(prefetched([1], depth=0))
