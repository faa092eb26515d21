"""What batching ranks on the device costs, predicted from the latency model (plain Python).

The device thread runs the ranks queued together in one step: the ranks served from device slots as one
batched call (`LatencyModel.predict_relay_batch_ms`), everything else (a miss, a DRAM copy, an extension)
one after the other. These forecasts decide how large a batch may grow (`relay.max_batch_delay_ms`) and what
admission control expects a queue of ranks to cost.
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


def queue_share(latency: LatencyModel, queued: int, max_batch: int) -> float:
    """Device time of `queued` equal ranks as a share of their single calls, when the device thread batches
    up to `max_batch` of them: full batches of `max_batch`, then one of the rest, each padded to its batch
    bucket (`LatencyModel.batch_bucket`). 1.0 when nothing is batched."""
    if queued < 1 or max_batch <= 1:
        return 1.0
    full, rest = divmod(queued, max_batch)
    cost = 0.0
    for size, count in ((max_batch, full), (rest, 1 if rest else 0)):
        if count:
            bucket, factor = latency.batch_bucket(size)
            cost += count * bucket * factor
    return cost / queued
