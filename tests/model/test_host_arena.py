"""HostArena: regions never overlap, come back only when the last view dies, and coalesce."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from mindspore_relaygr.model import host_arena
from mindspore_relaygr.model.host_arena import ALIGN, HostArena, shared_arena


def test_regions_are_disjoint_aligned_and_sized():
    arena = HostArena(1 << 20)
    arrays = [arena.empty((3, 5, 7)), arena.empty((100,), np.int64), arena.empty((2, 64))]
    assert [a.shape for a in arrays] == [(3, 5, 7), (100,), (2, 64)]
    assert arrays[1].dtype == np.int64 and arrays[0].dtype == np.float32
    for i, a in enumerate(arrays):
        assert a.__array_interface__["data"][0] % ALIGN == 0
        a[...] = i + 1
    for i, a in enumerate(arrays):  # nobody wrote over anybody
        assert np.all(a == i + 1)
    assert arena.stats()["in_use_bytes"] == sum(-(-a.nbytes // ALIGN) * ALIGN for a in arrays)


def test_a_region_comes_back_only_after_its_last_view_dies():
    arena = HostArena(1 << 20)
    copy = arena.empty((2, 4, 10, 8))
    keys = copy[0][:, :5]  # what a slot copy keeps: a slice of the allocation
    del copy
    gc.collect()
    assert arena.stats()["in_use_bytes"] > 0, "a live slice must keep its region"
    keys[...] = 7.0
    again = arena.empty((2, 4, 10, 8))  # must not reuse the region keys still points into
    again[...] = 0.0
    assert np.all(keys == 7.0)
    del keys, again
    assert arena.stats()["in_use_bytes"] == 0


def test_freed_neighbours_coalesce_and_the_whole_capacity_is_reusable():
    arena = HostArena(64 * ALIGN)
    a, b, c = (arena.empty((16 * ALIGN // 4,)) for _ in range(3))  # 16 blocks each
    del b
    del a  # a and b merge
    assert arena.stats()["free_regions"] == 2 and arena.stats()["largest_free_bytes"] == 32 * ALIGN
    del c
    stats = arena.stats()
    assert stats["free_regions"] == 1 and stats["largest_free_bytes"] == arena.capacity
    whole = arena.empty((arena.capacity // 4,))
    assert whole is not None and arena.stats()["largest_free_bytes"] == 0


def test_a_request_that_does_not_fit_returns_none_and_is_counted():
    arena = HostArena(16 * ALIGN)
    keep = arena.empty((8 * ALIGN // 4,))
    assert arena.empty((12 * ALIGN // 4,)) is None
    assert arena.stats()["fallbacks"] == 1 and keep is not None


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0"):
        HostArena(0)


def test_the_shared_arena_is_reused_until_a_larger_one_is_asked_for(monkeypatch):
    monkeypatch.setattr(host_arena, "_shared", None)
    first, seconds = shared_arena(1 << 20)
    assert seconds >= 0.0
    assert shared_arena(1 << 19) == (first, 0.0)
    larger, _ = shared_arena(1 << 21)
    assert larger is not first and larger.capacity == 1 << 21
