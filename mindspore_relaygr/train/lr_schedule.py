"""Learning-rate schedules of the ranker's optimizer, as the per-step lists MindSpore's optimizers take."""

from __future__ import annotations

import numpy as np


def step_learning_rates(base_lr: float, schedule: str, total_steps: int) -> float | list[float]:
    """The learning rate of every optimizer step: `base_lr` itself for "constant"; for "cosine", step t of
    `total_steps` gets base_lr * (1 + cos(pi * t / total_steps)) / 2, from base_lr at step 0 towards 0 at the
    last step (MindSpore holds the last value for steps past the list, e.g. after a resume with more epochs)."""
    if schedule == "constant":
        return base_lr
    if schedule != "cosine":
        raise ValueError(f"unknown learning-rate schedule {schedule!r} (constant, cosine)")
    if total_steps < 1:
        raise ValueError(f"a cosine schedule needs >= 1 step, got {total_steps}")
    t = np.arange(total_steps, dtype=np.float64)
    return (base_lr * 0.5 * (1.0 + np.cos(np.pi * t / total_steps))).tolist()
