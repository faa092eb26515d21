"""The data every training and evaluation step shares: interactions, leave-one-out split, eval sets (numpy only).

`prepare_data(config)` loads the interactions named by `config.data`, checks them against `config.model`
(item vocabulary, action types, user features) and splits them; the validation and test sets draw their
negatives from `data.eval_seed`, so every model and every run is evaluated on the same candidates.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.data.movielens import Interactions, load_movielens
from mindspore_relaygr.data.sequences import (
    NUM_ACTIONS,
    EvalExample,
    History,
    Split,
    build_eval_set,
    build_sequences,
    leave_one_out,
)
from mindspore_relaygr.errors import ConfigError

logger = logging.getLogger(__name__)

EVAL_SEED_OFFSETS = {"valid": 0, "test": 1}  # distinct negatives for the two sets from one seed


@dataclass(frozen=True)
class PreparedData:
    """Interactions, their leave-one-out split and the history cap the model can take."""

    interactions: Interactions
    split: Split
    max_history_len: int  # events (the user token excluded)
    num_eval_negatives: int
    eval_seed: int

    @property
    def num_items(self) -> int:
        return self.interactions.num_items

    def training_sequences(self, include_valid: bool = False) -> dict[int, History]:
        """What trains: the training split, or with `include_valid` every event but the test target (the
        generative-recommenders protocol)."""
        if not include_valid:
            return self.split.train
        return {uid: self.split.test[uid].history if uid in self.split.test else seq
                for uid, seq in self.split.train.items()}

    def eval_set(self, which: str, max_users: int | None = None) -> list[EvalExample]:
        """The `which` ("valid" | "test") examples, ascending user id; the first `max_users` when given.

        Negatives are drawn for every user before truncating, so a user's candidates never depend on
        `max_users`."""
        rng = np.random.default_rng([self.eval_seed, EVAL_SEED_OFFSETS[which]])
        examples = build_eval_set(self.split, which, self.num_items, rng, self.num_eval_negatives,
                                  self.max_history_len)
        return examples if max_users is None else examples[:max_users]


def check_compatible(config: RelayGRConfig, data: Interactions) -> None:
    """Raise ConfigError if `config.model` cannot represent `data`, naming the key to change."""
    model = config.model
    if data.num_items > model.num_items:
        raise ConfigError(f"model.num_items={model.num_items}: the data has {data.num_items} items "
                          f"({data.source})")
    if model.num_actions != NUM_ACTIONS:
        raise ConfigError(f"model.num_actions={model.num_actions}: ratings 1..5 give {NUM_ACTIONS} action types")
    sizes = list(data.user_feature_sizes)
    if model.user_feature_sizes and model.user_feature_sizes != sizes:
        raise ConfigError(f"model.user_feature_sizes={model.user_feature_sizes}: the data has user features of "
                          f"sizes {sizes or 'none'} ({data.source})")
    negatives = config.data.num_eval_negatives
    if negatives + 1 > model.max_candidates:
        raise ConfigError(f"data.num_eval_negatives={negatives}: 1 + negatives exceeds the largest candidate "
                          f"bucket {model.max_candidates}")


def max_history_len(config: RelayGRConfig) -> int:
    """The longest history (events) a training or evaluation request carries."""
    limit = config.model.max_seq_len - (1 if config.model.has_user_token else 0)
    cap = config.train.max_history_len
    if cap is not None and cap > limit:
        raise ConfigError(f"train.max_history_len={cap}: the model takes at most {limit} events")
    return limit if cap is None else cap


def prepare_data(config: RelayGRConfig, interactions: Interactions | None = None) -> PreparedData:
    """Load (unless given), check and split the interactions named by `config.data`."""
    data = interactions if interactions is not None else load_movielens(config.data.path)
    check_compatible(config, data)
    sequences = build_sequences(data, with_user_features=config.model.has_user_token)
    split = leave_one_out(sequences, config.data.min_events)
    logger.info("data: %d users (%d evaluated), %d items, %d events", data.num_users, len(split.test),
                data.num_items, len(data))
    return PreparedData(data, split, max_history_len(config), config.data.num_eval_negatives, config.data.eval_seed)
