"""What batching ranks on the device costs, predicted from the latency model (plain Python).

The device thread runs the ranks queued together in one step: the ranks served from device slots as one
batched call (`LatencyModel.predict_relay_batch_ms`), everything else (a miss, a DRAM copy, an extension)
one after the other. These forecasts decide how large a batch may grow (`relay.max_batch_delay_ms`), how many
of the queued ranks one call takes (`batch_size`: a size that pads to a larger batch bucket pays for the
padding) and what admission control expects a queue of ranks to cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mindspore_relaygr.relay.latency import LatencyModel


@dataclass(frozen=True)
class RankForecast:
    """One rank's predicted device work, made when it is submitted (the cache may change before it runs)."""

    serial_ms: float  # work it runs on its own: a miss, or the DRAM copy / extension before a cached rank
    shape: tuple[int, int, int] | None = None  # (prefix tokens, suffix events, candidates) of its cached rank

    def alone_ms(self, latency: LatencyModel) -> float:
        """Its device time ranked on its own."""
        return self.serial_ms + (latency.predict_relay_ms(*self.shape) if self.shape else 0.0)


def step_ms(latency: LatencyModel, forecasts: Sequence[RankForecast]) -> float:
    """Predicted time of one device step ranking all of `forecasts`: their serial work, then one batched call
    for those served from a device slot."""
    shapes = [f.shape for f in forecasts if f.shape is not None]
    return sum(f.serial_ms for f in forecasts) + latency.predict_relay_batch_ms(shapes)


def delay_of_first_ms(latency: LatencyModel, forecasts: Sequence[RankForecast]) -> float:
    """How much later the first rank finishes when the others share its device step than when it runs alone."""
    return step_ms(latency, forecasts) - forecasts[0].alone_ms(latency)


def per_rank_cost(latency: LatencyModel, size: int) -> float:
    """One call of `size` equal ranks, padded to its batch bucket, as a share of their `size` single calls."""
    bucket, factor = latency.batch_bucket(size)
    return bucket * factor / size


def batch_size(latency: LatencyModel, available: int) -> int:
    """How many of `available` queued ranks (the first included) one device call takes: the size that costs
    least per rank (`per_rank_cost`), the larger on a tie. With batch factors 1, 0.92, 0.83 at 1, 2 and 4
    users, three queued ranks run as two and then one: three padded to four cost 1.11 single calls each, more
    than one at a time. No batch factors measured: all of them."""
    if available < 1:
        raise ValueError(f"available={available!r}: must be >= 1")
    best, best_cost = 1, per_rank_cost(latency, 1)
    for size in range(2, available + 1):
        cost = per_rank_cost(latency, size)
        if cost <= best_cost * (1 + 1e-9):
            best, best_cost = size, cost
    return best


def unpadded_size(buckets: Sequence[int], available: int) -> int:
    """The largest batch bucket within `available` (1 at least): what a batch takes when one call of B users
    costs about B single calls, as prefill chunks do on a CPU, so padding would only add work."""
    if available < 1:
        raise ValueError(f"available={available!r}: must be >= 1")
    return max([b for b in buckets if b <= available], default=1)


def queue_share(latency: LatencyModel, queued: int, max_batch: int) -> float:
    """Device time of `queued` equal ranks as a share of their single calls, when the device thread batches
    up to `max_batch` of them as `batch_size` chooses, each call padded to its batch bucket. 1.0 when nothing
    is batched."""
    if queued < 1 or max_batch <= 1:
        return 1.0
    # While max_batch or more are left, every call takes the same size: count those calls at once, so the
    # cost of this admission check does not grow with the queue.
    full_size = batch_size(latency, max_batch)
    full_calls = max(0, -(-(queued - max_batch + 1) // full_size))
    cost, left = full_calls * full_size * per_rank_cost(latency, full_size), queued - full_calls * full_size
    while left:
        size = batch_size(latency, left)
        cost += size * per_rank_cost(latency, size)
        left -= size
    return cost / queued
