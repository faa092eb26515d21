"""Tail statistics that hold up: a P99 with a bootstrap interval, and compliance judged on it.

A P99 from a few hundred ranks is close to the sample maximum and flips between neighbouring loads,
so a headline point counts as compliant only if the upper end of its P99 interval is within the
budget, and a mode's compliant load (or length) is the highest tested value at and below which
every tested point complies: one lucky point above a failing one does not count.

The bootstrap treats the latencies of a run as independent draws. Queueing correlates neighbouring
requests, so the interval understates the uncertainty somewhat; the load (or length) grid adds its
own: a compliant value is bracketed by the first failing one above it (`bracket`, `ratio_range`).
Plain numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_RANKS = 1000  # ranks per point the headline commands aim for (a P99 from 100 is nearly the maximum)


def percentile_interval(samples: Sequence[float], q: float = 99.0, confidence: float = CONFIDENCE,
                        resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high): the q-th percentile of `samples` and its percentile-bootstrap interval.

    Seeded, so a report is reproducible from its samples. NaNs for an empty sample."""
    if not 0 < q < 100 or not 0 < confidence < 1 or resamples < 1:
        raise ValueError(f"q={q}, confidence={confidence}, resamples={resamples}: need 0<q<100, 0<confidence<1, "
                         "resamples>=1")
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boot = np.percentile(x[rng.integers(0, x.size, size=(resamples, x.size))], q, axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(boot, [tail, 100 - tail])
    return float(np.percentile(x, q)), float(low), float(high)


def p99_summary(latencies_ms: Sequence[float], seed: int = 0) -> dict[str, float | int]:
    """P99 with its interval, for a report: p99_ms, p99_low_ms, p99_high_ms, samples."""
    est, low, high = percentile_interval(latencies_ms, 99.0, seed=seed)
    return {"p99_ms": est, "p99_low_ms": low, "p99_high_ms": high, "samples": len(latencies_ms)}


def complies(point: dict[str, Any], budget_ms: float) -> bool:
    """No errors or refusals, and the P99 interval's upper end within the budget."""
    return point["errors"] == 0 and point.get("rejected_503", 0) == 0 and point["p99_high_ms"] <= budget_ms


def compliant_value(points: Sequence[dict[str, Any]], axis: str, budget_ms: float) -> float:
    """The highest `axis` value (load or length) at and below which every tested point complies; 0 if
    the lowest tested point does not. Points of one mode; values may repeat (repeated runs: all must
    comply)."""
    best = 0.0
    for value in sorted({p[axis] for p in points}):
        if not all(complies(p, budget_ms) for p in points if p[axis] == value):
            break
        best = value
    return best


def bracket(points: Sequence[dict[str, Any]], axis: str, budget_ms: float) -> tuple[float, float | None]:
    """(compliant value, the first tested value above it that fails, or None if none failed): the true
    limit of the mode lies between the two."""
    best = compliant_value(points, axis, budget_ms)
    failing = [p[axis] for p in points if p[axis] > best and not complies(p, budget_ms)]
    return best, (min(failing) if failing else None)


def ratio_range(relay: tuple[float, float | None], baseline: tuple[float, float | None]) -> tuple[float, float]:
    """The relay/baseline ratio the load grid allows, from two `bracket`s: (lowest, highest). The
    lower end is nan if the baseline never failed (its limit is unknown above), the upper end inf if
    the relay never failed or the baseline complied nowhere."""
    (r_best, r_fail), (b_best, b_fail) = relay, baseline
    low = r_best / b_fail if b_fail else float("nan")
    high = r_fail / b_best if r_fail is not None and b_best else float("inf")
    return low, high


def ratio(relay: float, baseline: float) -> float:
    """relay / baseline; inf if only the relay complies anywhere, nan if neither does."""
    if baseline:
        return relay / baseline
    return float("inf") if relay else float("nan")
