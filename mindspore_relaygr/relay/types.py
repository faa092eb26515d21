"""Results crossing the RelayEngine boundary (plain data; what serving turns into JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CACHE_TIERS = ("device", "dram", "inflight", "partial", "miss", "bypass")


@dataclass(frozen=True)
class PreinferResult:
    """Decision on a pre-infer signal; the prefill itself runs asynchronously when admitted."""

    admitted: bool
    reason: str  # admitted | not_at_risk | footprint | load | already_cached | inflight | too_long | disabled
    cache_key: str | None  # short id of the prefix key (None when not admitted)
    predicted_full_ms: float


@dataclass(frozen=True)
class RankResult:
    """Scores of every candidate (in request order) and the top-k ranking."""

    scores: np.ndarray  # float32 [M, num_tasks]
    ranking: list[int]  # candidate indices, best first, at most top_k
    cache: str  # one of CACHE_TIERS
    truncated: bool = False  # ranked on fewer than all of the history's events (ranked_events of them)
    timings_ms: dict[str, float] = field(default_factory=dict)  # wait, queue, compute, total
    ranked_events: int = 0  # the most recent events the scores saw (the whole history unless truncated)
