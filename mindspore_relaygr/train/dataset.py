"""The data every training and evaluation step shares: interactions, leave-one-out split, eval sets (numpy only).

`prepare_data(config)` loads the interactions named by `config.data`, sizes `config.model` by them (item
vocabulary, event types, user features: a null size comes from the data, a set one must agree) and splits them;
the validation and test sets draw their negatives from `data.eval_seed`, so every model and every run is
evaluated on the same candidates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.data.events import Interactions, load_interactions
from mindspore_relaygr.data.sequences import (
    EvalExample,
    History,
    Split,
    build_eval_set,
    build_sequences,
    leave_one_out,
)
from mindspore_relaygr.errors import ConfigError, DataError

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
    config: RelayGRConfig | None = None  # the config, its model sized by the data (`sized_config`)

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


def sized_config(config: RelayGRConfig, data: Interactions) -> RelayGRConfig:
    """`config` with the model's vocabulary sizes from `data` (the null ones); ConfigError naming the key when
    a set size, the tasks or the candidate buckets contradict the data."""
    model, source = config.model, data.source
    sizes = {"num_items": data.num_items, "num_actions": data.num_actions,
             "user_feature_sizes": list(data.user_feature_sizes)}
    types = f" (event types {', '.join(map(str, data.event_types))})" if data.event_types else \
        " (no data.event_column: one event type)"
    plural = "s" if data.num_actions != 1 else ""
    why = {"num_items": f"the data has {data.num_items} items",
           "num_actions": f"the data has {data.num_actions} event type{plural}{types}",
           "user_feature_sizes": f"the data's user features {list(data.user_feature_names)} have sizes "
                                 f"{sizes['user_feature_sizes']} (values + 1 for unknown)"}
    for key, value in sizes.items():
        given = getattr(model, key)
        if given is not None and given != value:
            raise ConfigError(f"model.{key}={given}: {why[key]} ({source}); set it to {value} or to null (from "
                              f"the data)")
    tasks = model.task_names
    if data.labels is None and len(tasks) > 1:
        raise ConfigError(f"model.task_names={tasks}: the second task needs a label, and the data has none ({source}):"
                          f" set data.label_column or data.label_events, or model.task_names: [{tasks[0]}]")
    if data.labels is not None and len(tasks) != 2:
        raise ConfigError(f"model.task_names={tasks}: the data's label trains one second task; give two names, "
                          f"e.g. [{tasks[0]}, {config.data.label_column or 'label'}]")
    negatives = config.data.num_eval_negatives
    if negatives + 1 > model.max_candidates:
        raise ConfigError(f"data.num_eval_negatives={negatives}: 1 + negatives exceeds the largest candidate "
                          f"bucket {model.max_candidates}")
    if negatives > data.num_items - 1:
        raise ConfigError(f"data.num_eval_negatives={negatives}: the data has only {data.num_items} items")
    return dataclasses.replace(config, model=dataclasses.replace(model, **sizes))


def check_compatible(config: RelayGRConfig, data: Interactions) -> None:
    """Raise ConfigError if `config.model` cannot represent `data`, naming the key to change (`sized_config`)."""
    sized_config(config, data)


CHECKPOINT_TABLES = {"item_table": ("num_items", 1), "action_table": ("num_actions", 2)}  # rows = size + extra
VOCABULARY_NAME = "vocabulary.json"  # next to a run's checkpoints: how its data numbered items, events, features


def vocabulary_record(data: Interactions) -> dict[str, Any]:
    """What the model's ids mean (JSON): the item ids in dense-id order (as a digest: catalogues are large), the
    event types in action-id order, the label rule and each user feature's values in id order."""
    items = json.dumps([raw for raw, _ in sorted(data.item_vocab.items(), key=lambda kv: kv[1])])
    return {"source": data.source, "items": data.num_items,
            "items_sha256": hashlib.sha256(items.encode()).hexdigest(),
            "event_types": list(data.event_types), "label": data.label_rule,
            "user_features": {name: [raw for raw, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
                              for name, vocab in zip(data.user_feature_names, data.user_feature_vocabs,
                                                     strict=True)}}


def save_vocabulary(data: Interactions, directory: Path) -> Path:
    """Write `vocabulary_record(data)` as `directory/vocabulary.json`; returns its path."""
    path = directory / VOCABULARY_NAME
    path.write_text(json.dumps(vocabulary_record(data), indent=1) + "\n")
    return path


def check_vocabulary(data: Interactions, checkpoint: str | Path) -> None:
    """DataError when `data` numbers its items, event types or feature values otherwise than the data the
    checkpoint was trained on (`vocabulary.json` next to it; no file: nothing to check). Equal sizes are not
    enough: a log with one item swapped for another has as many items, and every id after it would move."""
    path = Path(checkpoint).parent / VOCABULARY_NAME
    if not path.is_file():
        return
    saved, now = json.loads(path.read_text()), vocabulary_record(data)
    for key, what in (("items_sha256", "item ids"), ("event_types", "event types"), ("label", "label rule"),
                      ("user_features", "user-feature values")):
        if saved.get(key) != now[key]:
            shown = "" if key == "items_sha256" else f": {saved.get(key)} then, {now[key]} now"
            raise DataError(f"{data.source}: its {what} are not those checkpoint {checkpoint} was trained on "
                            f"({saved.get('source')}, recorded in {path}){shown}: use that data (the model's ids "
                            f"would mean other things)")


def check_checkpoint(config: RelayGRConfig, checkpoint: str | Path, data: Interactions | None = None) -> None:
    """ConfigError naming the key when the checkpoint's embedding tables do not have the rows `config.model`'s
    vocabulary sizes give (a model trained on other data, or a config that is not the checkpoint's); with
    `data`, also `check_vocabulary`."""
    import mindspore as ms

    params = ms.load_checkpoint(str(checkpoint), choice_func=lambda name: name.endswith("_table"))
    shapes = {name.rsplit(".", 1)[-1]: tuple(p.shape) for name, p in params.items()}
    model = config.model
    for table, (key, extra) in CHECKPOINT_TABLES.items():
        rows = shapes.get(table, (None,))[0]
        if rows is not None and rows != getattr(model, key) + extra:
            raise ConfigError(f"model.{key}={getattr(model, key)}: checkpoint {checkpoint} was trained with "
                              f"{key} {rows - extra}: use the config.yaml written next to it (or its data)")
    rows = shapes.get("user_table", (None,))[0]
    if rows is not None and rows != max(1, sum(model.user_feature_sizes or ())):
        raise ConfigError(f"model.user_feature_sizes={model.user_feature_sizes}: checkpoint {checkpoint} has a user "
                          f"table of {rows} rows: use the config.yaml written next to it (or its data)")
    if data is not None:
        check_vocabulary(data, checkpoint)


def max_history_len(config: RelayGRConfig) -> int:
    """The longest history (events) a training or evaluation request carries."""
    limit = config.model.max_seq_len - (1 if config.model.has_user_token else 0)
    cap = config.train.max_history_len
    if cap is not None and cap > limit:
        raise ConfigError(f"train.max_history_len={cap}: the model takes at most {limit} events")
    return limit if cap is None else cap


def prepare_data(config: RelayGRConfig, interactions: Interactions | None = None) -> PreparedData:
    """Load (unless given), check and split the interactions named by `config.data`; `.config` is `config` sized
    by them."""
    data = interactions if interactions is not None else load_interactions(config.data)
    config = sized_config(config, data)
    sequences = build_sequences(data, with_user_features=config.model.has_user_token, tie_seed=config.data.tie_seed)
    split = leave_one_out(sequences, config.data.min_events)
    if not split.test:
        longest = max((len(s) for s in sequences.values()), default=0)
        fix = "lower it (at least 3)" if longest >= 3 else "a user needs 3 (train, validation, test)"
        raise ConfigError(f"data.min_events={config.data.min_events}: no user of {data.source} has that many events "
                          f"(the most is {longest}): {fix}")
    logger.info("data: %d users (%d evaluated), %d items, %d events", data.num_users, len(split.test),
                data.num_items, len(data))
    return PreparedData(data, split, max_history_len(config), config.data.num_eval_negatives, config.data.eval_seed,
                        config)
