"""Waiting for a condition another thread or process brings about, instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.002


def wait_until(cond: Callable[[], object], timeout_s: float = 10.0, what: str = "the condition",
               poll_s: float = POLL_S) -> None:
    """Return as soon as `cond()` is true, checking it every `poll_s`; fail the test if it is not within
    `timeout_s` (a liveness bound, generous on purpose: the condition's own timing is never asserted)."""
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(poll_s)
