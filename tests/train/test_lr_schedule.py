"""train.lr_schedule: the per-step learning rates, and that the optimizer follows them."""

from __future__ import annotations

import math

import pytest

from mindspore_relaygr import load_config
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.train.lr_schedule import step_learning_rates
from tests.conftest import CONFIGS


def test_constant_is_the_base_rate():
    assert step_learning_rates(0.01, "constant", 100) == 0.01


def test_cosine_falls_from_the_base_rate_towards_zero():
    lrs = step_learning_rates(0.01, "cosine", 8)
    assert len(lrs) == 8
    assert lrs[0] == 0.01
    assert lrs[4] == pytest.approx(0.005)  # half way
    assert lrs[-1] == pytest.approx(0.01 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))
    assert all(a > b for a, b in zip(lrs[:-1], lrs[1:], strict=True))


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        step_learning_rates(0.01, "step", 8)
    with pytest.raises(ValueError, match=">= 1 step"):
        step_learning_rates(0.01, "cosine", 0)
    with pytest.raises(ConfigError, match="train.lr_schedule"):
        load_config(CONFIGS / "tiny.yaml", ["train.lr_schedule=linear"])


@pytest.mark.slow
def test_the_optimizer_follows_the_cosine_schedule(synthetic_config, tmp_path):
    """Step 0 runs at the base rate in both runs, so the first two losses agree; after that the cosine run
    steps with smaller rates and its losses part from the constant run's."""
    from mindspore_relaygr.train.trainer import train
    from tests.train.test_trainer import _cfg

    two = ["train.epochs=2", "train.eval_every=1"]
    constant = train(_cfg(synthetic_config, tmp_path / "constant", *two))
    cosine = train(_cfg(synthetic_config, tmp_path / "cosine", *two, "train.lr_schedule=cosine"))
    assert cosine.step_losses[:2] == constant.step_losses[:2]
    assert cosine.step_losses[-1] != constant.step_losses[-1]


class _StopAtEpoch(Exception):
    pass


@pytest.mark.slow
def test_a_resumed_cosine_run_continues_its_schedule(synthetic_config, tmp_path):
    """The optimizer's step counter is in last.ckpt: a run stopped after epoch 1 of 2 and resumed trains epoch 2
    at the rates of the uninterrupted run, so its losses are the same."""
    from mindspore_relaygr.train.trainer import train
    from tests.train.test_trainer import _cfg

    two = ["train.epochs=2", "train.eval_every=1", "train.lr_schedule=cosine"]
    whole = train(_cfg(synthetic_config, tmp_path / "whole", *two))

    def stop_in_epoch_2(message: str) -> None:
        if message.startswith("epoch 2/2"):
            raise _StopAtEpoch(message)

    with pytest.raises(_StopAtEpoch):
        train(_cfg(synthetic_config, tmp_path / "stopped", *two), progress=stop_in_epoch_2)
    resumed = train(_cfg(synthetic_config, tmp_path / "stopped", *two), resume=True)
    assert resumed.epoch_losses == whole.epoch_losses
