"""Dropout whose masks come from random bytes drawn on the host, so that a seed fixes a training run.

MindSpore's CPU Dropout kernel fills its mask from several threads sharing one generator: seeded runs with
it differ after a few steps (and one nn.Dropout cell used at several sites repeats its mask). Here the
training loop draws one uint8 array per dropout site from a numpy generator and the graph keeps a value iff
its byte >= threshold (inverted dropout: kept values are scaled up). No noise input: identity (inference).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from mindspore import dtype as mstype
from mindspore import ops


def dropout_threshold(p: float) -> tuple[int, float]:
    """(threshold, scale) of dropout rate p from random bytes: keep iff byte >= threshold, i.e. with probability
    1 - threshold / 256 (the rate is p rounded to 1/256), and scale the kept values by 256 / (256 - threshold)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {p}")
    threshold = min(255, round(p * 256))
    return threshold, 256.0 / (256 - threshold)


def dropout_noise(rng: np.random.Generator, shapes: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, ...]:
    """One uniform random uint8 array per shape, drawn from `rng` in order."""
    return tuple(np.frombuffer(rng.bytes(math.prod(s)), np.uint8).reshape(s) for s in shapes)


def apply_dropout(x, noise, threshold: int, scale: float):
    """Inverted dropout of the MindSpore tensor x with the host's bytes `noise` (x's shape); None: x itself.
    Usable inside a graph's construct."""
    if noise is None or threshold == 0:
        return x
    return x * ops.cast(noise >= threshold, mstype.float32) * scale
