"""Per-signature timing of compiled graph calls, and detection of compiles on the request path.

A signature is a graph kind plus its input shapes: MindSpore compiles once per signature, so the
first call of a signature after warm-up ("cold") paid a compile a request was waiting for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

Signature = tuple[str, tuple[tuple[int, ...], ...]]


@dataclass
class CallTiming:
    """Calls of one signature since the last `reset`: count, total and slowest milliseconds."""

    kind: str
    shapes: tuple[tuple[int, ...], ...]
    calls: int = 0
    total_ms: float = 0.0
    max_ms: float = 0.0

    def as_dict(self) -> dict:
        return {"kind": self.kind, "shapes": [list(s) for s in self.shapes], "calls": self.calls,
                "mean_ms": self.total_ms / self.calls if self.calls else 0.0, "max_ms": self.max_ms}


class GraphCallStats:
    """Timing per signature; once `mark_warm` is called, a new signature is a cold call (logged)."""

    def __init__(self) -> None:
        self._seen: set[Signature] = set()
        self._timings: dict[Signature, CallTiming] = {}
        self._warm = False
        self.cold_calls: list[CallTiming] = []

    def record(self, kind: str, shapes: Sequence[Sequence[int]], ms: float) -> None:
        """Count one call of `kind` on inputs of `shapes` that took `ms`."""
        sig: Signature = (kind, tuple(tuple(int(d) for d in s) for s in shapes))
        row = self._timings.get(sig)
        if row is None:
            row = self._timings[sig] = CallTiming(kind, sig[1])
        row.calls += 1
        row.total_ms += ms
        row.max_ms = max(row.max_ms, ms)
        if sig not in self._seen:
            self._seen.add(sig)
            if self._warm:
                self.cold_calls.append(CallTiming(kind, sig[1], 1, ms, ms))
                logger.warning("graph %s compiled on the request path (%.0f ms): input shapes %s not warmed up",
                               kind, ms, list(sig[1]))

    def mark_warm(self) -> None:
        """Every signature seen so far was warmed up; later first calls count as cold."""
        self._warm = True

    def reset(self) -> None:
        """Forget timings and cold calls (the set of compiled signatures stays)."""
        self._timings.clear()
        self.cold_calls = []

    def slowest(self, n: int = 5) -> list[dict]:
        """The `n` signatures with the slowest single call since the last reset."""
        rows = sorted(self._timings.values(), key=lambda r: r.max_ms, reverse=True)
        return [r.as_dict() for r in rows[:n]]
