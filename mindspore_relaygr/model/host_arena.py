"""A pre-touched block of host memory that DRAM-tier slot copies are carved from (plain numpy).

On the VMs we run on, first-touching fresh memory costs ~2.5 ms per MB, and a spill that lands on
memory malloc has not handed out before pays it on the device thread. The arena is touched once at
start-up and its regions are reused, so spills never depend on what malloc does. (It did not make
the slow 5120-event spills in the engine fast: they stayed at ~94 ms, cause unknown; see the
model-zoo README.)

A region is given back when the array handed out (and every view of it) is garbage collected, so
a copy that an in-progress reload still reads can never be overwritten by a new spill.
"""

from __future__ import annotations

import bisect
import threading
import time
import weakref

import numpy as np

ALIGN = 64  # bytes: cache-line aligned regions


class HostArena:
    """First-fit allocator over one touched numpy buffer; thread-safe."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes={capacity_bytes}: must be > 0")
        self.capacity = int(capacity_bytes) // ALIGN * ALIGN
        t0 = time.perf_counter()
        raw = np.zeros(self.capacity + ALIGN, np.uint8)
        raw.fill(0)  # every page faulted in now (zeros alone may map them lazily)
        start = -raw.__array_interface__["data"][0] % ALIGN
        self._buffer = raw[start:start + self.capacity]
        self.touch_seconds = time.perf_counter() - t0
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, self.capacity)]  # sorted (offset, size), coalesced
        self.in_use = 0
        self.allocations = 0
        self.fallbacks = 0  # requests that did not fit (the caller used np.empty)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray | None:
        """An uninitialised array from the arena, or None if no free region is large enough."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        with self._lock:
            for i, (offset, free) in enumerate(self._free):
                if free >= size:
                    if free == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, free - size)
                    self.in_use += size
                    self.allocations += 1
                    break
            else:
                self.fallbacks += 1
                return None
        # frombuffer over a memoryview: numpy then roots every view and slice of the result at `flat`
        # (view chains collapse only through arrays), so `flat` dies only after the last view does.
        flat = np.frombuffer(memoryview(self._buffer)[offset:offset + nbytes], dtype)
        weakref.finalize(flat, self._give_back, offset, size)
        return flat.reshape(shape)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"capacity_bytes": self.capacity, "in_use_bytes": self.in_use, "free_regions": len(self._free),
                    "largest_free_bytes": max((s for _, s in self._free), default=0),
                    "allocations": self.allocations, "fallbacks": self.fallbacks}

    def _give_back(self, offset: int, size: int) -> None:
        with self._lock:
            self.in_use -= size
            i = bisect.bisect_left(self._free, (offset, 0))
            # Merge with the following and the preceding free regions when they touch.
            if i < len(self._free) and self._free[i][0] == offset + size:
                size += self._free.pop(i)[1]
            if i > 0 and sum(self._free[i - 1]) == offset:
                offset, size = self._free[i - 1][0], self._free[i - 1][1] + size
                del self._free[i - 1]
                i -= 1
            self._free.insert(i, (offset, size))


_shared: HostArena | None = None
_shared_lock = threading.Lock()


def shared_arena(nbytes: int) -> tuple[HostArena, float]:
    """The process's arena, at least `nbytes` large (replaced by a larger one if needed: copies in
    the old one keep it alive until they are dropped). Returns it and the seconds spent touching."""
    global _shared
    with _shared_lock:
        if _shared is not None and _shared.capacity >= nbytes // ALIGN * ALIGN:
            return _shared, 0.0
        _shared = HostArena(nbytes)
        return _shared, _shared.touch_seconds
