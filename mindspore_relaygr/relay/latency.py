"""Latency model: predicted milliseconds of the full, relay and prefill paths from measured buckets.

Each kind of path is measured on a few shapes (a grid of length / candidate buckets). A prediction
interpolates along each axis in turn (tokens first, then suffix, then candidates), either

* `step` (what calibration on the model's buckets uses): a query costs what the next measured
  shape at or above it costs, because the graphs pad every request up to its bucket: 1100 events
  run the 2048-event graph and take its time, not a linear blend of the 1024 and 2048 times; or
* `linear`: piecewise linear between measured shapes (for costs that really vary smoothly).

Along every axis the measured values are first made non-decreasing (running maximum: noise never
makes a longer request look cheaper), queries below the first bucket take the first value, and
queries beyond the last bucket scale the last value in proportion (latency ~ length).
Proportional scaling (not the last segment's slope, which differs between rows of the grid) keeps
predictions monotone in every argument at once.

Ranks served from device slots can run B users in one call (`relay.max_rank_batch`). Such a call pads
every user to the largest prefix, suffix and candidate buckets among them and to a batch bucket, and
costs `B x factor(B)` single calls of that padded shape, `factor(B)` being the batch bucket's measured
ratio of one B-user call to B single calls (`batch_factors`, 1 for B = 1; below 1 when batching pays).
"""

from __future__ import annotations

import bisect
import json
import logging
import operator
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PROFILE_VERSION = 1
# Shape of each kind, in the order of a `calibrate` shape tuple and of the predict_* arguments.
KIND_AXES: dict[str, tuple[str, ...]] = {
    "full": ("tokens", "candidates"),
    "relay": ("tokens", "suffix", "candidates"),  # tokens = prefix length
    "prefill": ("tokens",),
}
_INT_FIELDS = ("tokens", "candidates", "suffix")
INTERPOLATIONS = ("step", "linear")


@dataclass(frozen=True)
class LatencyPoint:
    """One measured shape: `kind` in KIND_AXES; fields outside the kind's axes must be 0."""

    kind: str
    tokens: int
    candidates: int
    suffix: int
    ms: float

    def __post_init__(self) -> None:
        if self.kind not in KIND_AXES:
            raise ValueError(f"kind={self.kind!r}: must be one of {sorted(KIND_AXES)}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}={value!r}: must be an int >= 0")
            if name not in KIND_AXES[self.kind] and value != 0:
                raise ValueError(f"{name}={value!r}: must be 0 for kind {self.kind!r}")
        ms = self.ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms < float("inf"):
            raise ValueError(f"ms={ms!r}: must be a finite number >= 0")

    @property
    def coords(self) -> tuple[int, ...]:
        return tuple(getattr(self, axis) for axis in KIND_AXES[self.kind])


def _count(name: str, value: Any) -> int:
    """`value` as an int >= 0 (numpy integers accepted), else ValueError naming `name`."""
    try:
        n = operator.index(value)
    except TypeError:
        n = -1
    if isinstance(value, bool) or n < 0:
        raise ValueError(f"{name}={value!r}: must be an int >= 0")
    return n


def _interp1(xs: Sequence[float], ys: Sequence[float], x: float, step: bool) -> float:
    """Through (xs, ys): the next point up (step) or piecewise linear; flat below xs[0],
    proportional beyond xs[-1]."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * (x / xs[-1]) if xs[-1] > 0 else ys[-1]
    if step:
        return ys[bisect.bisect_left(xs, x)]  # smallest measured x >= query: the bucket it pads to
    i = bisect.bisect_right(xs, x)  # segment [i-1, i]
    slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + slope * (x - xs[i - 1])


def _running_max(values: list[float]) -> list[float]:
    out, best = [], float("-inf")
    for v in values:
        best = max(best, v)
        out.append(best)
    return out


class _Grid:
    """Nested interpolation (step or piecewise linear) over the axes of one kind (innermost axis first)."""

    def __init__(self, table: list[tuple[tuple[int, ...], float]], step: bool) -> None:
        self.depth, self.step = len(table[0][0]), step
        groups: dict[int, list[tuple[tuple[int, ...], float]]] = {}
        for coords, ms in table:
            groups.setdefault(coords[-1], []).append((coords[:-1], ms))
        self.xs = sorted(groups)
        if self.depth == 1:
            self.ys = _running_max([groups[x][0][1] for x in self.xs])
        else:
            self.inner = [_Grid(groups[x], step) for x in self.xs]

    def __call__(self, query: tuple[float, ...]) -> float:
        if self.depth == 1:
            return _interp1(self.xs, self.ys, query[0], self.step)
        values = _running_max([g(query[:-1]) for g in self.inner])
        return _interp1(self.xs, values, query[-1], self.step)


class LatencyModel:
    """Predicts path latency in ms from measured `LatencyPoint`s (see module docstring)."""

    def __init__(self, points: Sequence[LatencyPoint], interpolation: str = "step",
                 batch_factors: Mapping[int, float] | None = None) -> None:
        """`batch_factors`: batch bucket -> one B-user call's time over B single calls (see the module
        docstring); none measured: every batch costs B single calls."""
        if not points:
            raise ValueError("points=[]: need at least one measured point")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation={interpolation!r}: must be one of {list(INTERPOLATIONS)}")
        self.interpolation = interpolation
        tables: dict[str, dict[tuple[int, ...], float]] = {}
        for p in points:
            table = tables.setdefault(p.kind, {})
            if p.coords in table:
                raise ValueError(f"{p!r}: duplicate {p.kind!r} shape {p.coords} (already {table[p.coords]} ms)")
            table[p.coords] = float(p.ms)
        self.points = list(points)
        self.batch_factors = _checked_factors(batch_factors or {})
        step = interpolation == "step"
        self._grids = {kind: _Grid(list(table.items()), step) for kind, table in tables.items()}

    @property
    def kinds(self) -> list[str]:
        """Kinds with at least one measured point."""
        return sorted(self._grids)

    def _predict(self, kind: str, query: tuple[int, ...]) -> float:
        query = tuple(_count(axis, v) for axis, v in zip(KIND_AXES[kind], query, strict=True))
        grid = self._grids.get(kind)
        if grid is None:
            raise ValueError(f"kind={kind!r}: no measured points; profile has {self.kinds}")
        return grid(query)

    def predict_full_ms(self, num_tokens: int, num_candidates: int) -> float:
        """Full inference of `num_tokens` behaviour tokens and `num_candidates` candidates."""
        return self._predict("full", (num_tokens, num_candidates))

    def predict_relay_ms(self, prefix_len: int, suffix_len: int, num_candidates: int) -> float:
        """Ranking against a cached prefix: `suffix_len` new tokens plus the candidates."""
        return self._predict("relay", (prefix_len, suffix_len, num_candidates))

    def predict_relay_batch_ms(self, shapes: Sequence[tuple[int, int, int]]) -> float:
        """One batched call ranking several users against their cached prefixes: `shapes` holds each user's
        (prefix_len, suffix_len, num_candidates); all are padded to the largest of each and to the batch
        bucket, which costs bucket x factor(bucket) single calls of that shape."""
        if not shapes:
            return 0.0
        padded = tuple(max(_count(axis, shape[i]) for shape in shapes) for i, axis in enumerate(KIND_AXES["relay"]))
        bucket, factor = self.batch_bucket(len(shapes))
        return bucket * factor * self.predict_relay_ms(*padded)

    def batch_bucket(self, batch: int) -> tuple[int, float]:
        """(the batch bucket a batch of `batch` users pads to, its factor): the smallest measured bucket that
        holds them; beyond the largest, the batch itself at the largest bucket's factor; none measured: (batch, 1)."""
        if _count("batch", batch) < 1:
            raise ValueError(f"batch={batch!r}: must be an int >= 1")
        for bucket, factor in self.batch_factors.items():
            if batch <= bucket:
                return bucket, factor
        return batch, (self.batch_factors[max(self.batch_factors)] if self.batch_factors else 1.0)

    def predict_prefill_ms(self, num_tokens: int) -> float:
        """Pre-inferring a prefix of `num_tokens` tokens into a cache slot."""
        return self._predict("prefill", (num_tokens,))

    def predict_prefill_chunks_ms(self, num_tokens: int, chunk_len: int) -> list[float]:
        """Split of `predict_prefill_ms(num_tokens)` into chunks of `chunk_len` tokens (sums to it)."""
        if _count("chunk_len", chunk_len) < 1:
            raise ValueError(f"chunk_len={chunk_len!r}: must be an int >= 1")
        num_tokens = _count("num_tokens", num_tokens)
        if num_tokens == 0:
            return []
        total = self.predict_prefill_ms(num_tokens)
        ends = list(range(chunk_len, num_tokens, chunk_len)) + [num_tokens]
        cumulative = [self.predict_prefill_ms(e) for e in ends[:-1]] + [total]
        return [c - prev for prev, c in zip([0.0] + cumulative[:-1], cumulative, strict=True)]

    def predict_extend_chunks_ms(self, prefix_tokens: int, new_tokens: int, chunk_len: int) -> list[float]:
        """Extending a cached prefix of `prefix_tokens` by `new_tokens`, in chunks of `chunk_len`: each
        chunk attends to everything before it, so it costs what the last chunks of a fresh prefill
        of all the tokens cost (`predict_prefill_chunks_ms`); never more than that prefill."""
        prefix_tokens, new_tokens = _count("prefix_tokens", prefix_tokens), _count("new_tokens", new_tokens)
        if new_tokens == 0:
            return []
        fresh = self.predict_prefill_chunks_ms(prefix_tokens + new_tokens, chunk_len)
        return fresh[-min(len(fresh), -(-new_tokens // chunk_len)):]

    # ---- persistence and calibration ----

    def to_json(self, path: str | Path) -> None:
        """Write the measured points as a JSON profile (`from_json` reads it back)."""
        doc = {"version": PROFILE_VERSION, "interpolation": self.interpolation,
               "points": [asdict(p) for p in self.points],
               "batch_factors": {str(b): f for b, f in self.batch_factors.items()}}
        Path(path).write_text(json.dumps(doc, indent=1) + "\n")

    @classmethod
    def from_json(cls, path: str | Path) -> LatencyModel:
        """Read a profile written by `to_json`; ValueError names what is wrong with a bad file."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"latency profile {str(path)!r}: cannot read: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ValueError(f"latency profile {str(path)!r}: not valid JSON: {exc}") from exc
        points = _points_from_doc(doc, str(path))
        try:
            # Profiles written before the interpolation key existed were meant as linear; before the batch
            # factors, batches were not measured.
            return cls(points, doc.get("interpolation", "linear"), _factors_from_doc(doc.get("batch_factors", {})))
        except ValueError as exc:
            raise ValueError(f"latency profile {str(path)!r}: {exc}") from exc

    @classmethod
    def calibrate(
        cls, measure: Callable[[str, tuple], float], shapes: dict[str, list[tuple]], repeats: int = 3
    ) -> LatencyModel:
        """Median of `repeats` calls `measure(kind, shape)` per shape; shapes ordered as KIND_AXES."""
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"repeats={repeats!r}: must be an int >= 1")
        points = []
        for kind, kind_shapes in shapes.items():
            axes = KIND_AXES.get(kind)
            if axes is None:
                raise ValueError(f"shapes[{kind!r}]: unknown kind; known {sorted(KIND_AXES)}")
            for shape in kind_shapes:
                if len(shape) != len(axes):
                    raise ValueError(f"shapes[{kind!r}] shape {shape!r}: expected {len(axes)} values {axes}")
                dims = dict.fromkeys(_INT_FIELDS, 0) | {a: _count(a, v) for a, v in zip(axes, shape, strict=True)}
                ms = statistics.median(float(measure(kind, tuple(shape))) for _ in range(repeats))
                logger.debug("calibrated %s %s: %.3f ms", kind, shape, ms)
                points.append(LatencyPoint(kind=kind, ms=ms, **dims))
        return cls(points)


def _checked_factors(factors: Mapping[int, float]) -> dict[int, float]:
    """Batch factors sorted by bucket, each bucket an int >= 1 and each factor a finite number > 0."""
    out = {}
    for bucket, factor in sorted(factors.items()):
        if _count("batch bucket", bucket) < 1:
            raise ValueError(f"batch bucket {bucket!r}: must be an int >= 1")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < float("inf"):
            raise ValueError(f"batch_factors[{bucket}]={factor!r}: must be a finite number > 0")
        out[int(bucket)] = float(factor)
    return out


def _factors_from_doc(raw: Any) -> dict[int, float]:
    if not isinstance(raw, dict):
        raise ValueError(f"'batch_factors' must be an object of batch bucket -> factor, got {raw!r}")
    try:
        return {int(bucket): factor for bucket, factor in raw.items()}
    except ValueError as exc:
        raise ValueError(f"'batch_factors': every key must be a batch bucket (an integer): {exc}") from exc


def _points_from_doc(doc: Any, where: str) -> list[LatencyPoint]:
    if not isinstance(doc, dict):
        raise ValueError(f"latency profile {where!r}: top level must be an object, got {type(doc).__name__}")
    if doc.get("version") != PROFILE_VERSION:
        raise ValueError(f"latency profile {where!r}: version={doc.get('version')!r}, expected {PROFILE_VERSION}")
    raw = doc.get("points")
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"latency profile {where!r}: 'points' must be a non-empty list, got {raw!r}")
    fields = ("kind", *_INT_FIELDS, "ms")
    points = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != set(fields):
            raise ValueError(
                f"latency profile {where!r}: points[{i}]={item!r}: must be an object "
                f"with exactly the keys {list(fields)}"
            )
        try:
            points.append(LatencyPoint(**item))
        except ValueError as exc:
            raise ValueError(f"latency profile {where!r}: points[{i}]: {exc}") from exc
    return points
