"""The catalogue's ids on the HTTP API: raw item ids, event types and user-feature values -> the model's dense ids.

An instance serving a bundle (`relaygr serve --bundle`) reads the vocabularies the model was trained with
(`items.json`, `events.json`, `users.json`) and, by default, takes requests in the raw ids of the training log:
item ids and feature values as strings or integers (`"sku-042"`, `42`), event types as the log wrote them
(`"click"`, or a rating `4`). Ids are matched as the data reader read them: integer ids by value (`42`, `"42"`
and `"42.0"` are one id), text ids by their text (stripped). An id the model was not trained on is a 400 naming
it: the model has no embedding for an unseen item (dense id 0 is padding, never trained), so scoring one would
be a guess. A user-feature value may be `null` (unknown, as in training).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mindspore_relaygr.data.events import canonical
from mindspore_relaygr.errors import InvalidRequest

ID_SPACES = ("raw", "dense")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _shown(value: Any, limit: int = 64) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class IdMap:
    """Raw -> dense ids of one vocabulary; `numeric`: the ids are integers (matched by value), else text."""

    dense: dict[int | str, int]
    numeric: bool
    what: str  # "item", "event type", "value of user feature 'segment'"

    @classmethod
    def of(cls, vocab: Mapping[int | str, int], what: str, numeric: bool | None = None) -> IdMap:
        numeric = all(isinstance(k, int) for k in vocab) if numeric is None else numeric
        return cls({cls._key(k, numeric): v for k, v in vocab.items()}, numeric, what)

    @staticmethod
    def _key(value: int | str, numeric: bool) -> int | str:
        return canonical(str(value)) if numeric else str(value).strip()

    def lookup(self, value: Any, field: str, index: int) -> int:
        """The dense id of a raw id from a request; InvalidRequest naming the field, index and id otherwise."""
        if type(value) is not int and not isinstance(value, str):
            article = "an" if self.what[0] in "aeiou" else "a"
            raise InvalidRequest(field, f"value at index {index} must be {article} {self.what} (a string or an "
                                        f"integer), got {_json_type(value)}")
        dense = self.dense.get(self._key(value, self.numeric))
        if dense is None:
            raise InvalidRequest(field, f"{self.what} {_shown(value)} at index {index} is not one the model was "
                                        f"trained on")
        return dense


@dataclass(frozen=True)
class Catalogue:
    """The raw -> dense maps of a bundle's vocabularies (`mindspore_relaygr.export.Vocabulary`)."""

    items: IdMap
    events: IdMap | None  # None: the model was trained without an event column (every event is action 0)
    features: tuple[IdMap, ...]
    feature_names: tuple[str, ...]
    event_types: tuple[int | str, ...]
    num_items: int

    @classmethod
    def from_vocabulary(cls, vocab: Any) -> Catalogue:
        events = None
        if vocab.event_types:
            events = IdMap.of({t: k for k, t in enumerate(vocab.event_types)}, "event type", numeric=True)
        features = tuple(IdMap.of(v, f"value of user feature {name!r}", numeric=True)
                         for name, v in zip(vocab.user_feature_names, vocab.user_feature_vocabs, strict=True))
        return cls(IdMap.of(vocab.item_vocab, "item"), events, features, tuple(vocab.user_feature_names),
                   tuple(vocab.event_types), len(vocab.item_vocab))

    def describe(self) -> dict[str, Any]:
        """What a caller needs to speak these ids (`/v1/stats`)."""
        return {"items": self.num_items, "event_types": list(self.event_types),
                "user_features": list(self.feature_names)}

    def item_ids(self, values: Any, field: str, max_len: int) -> list[int]:
        return [self.items.lookup(v, field, i) for i, v in enumerate(_array(values, field, max_len))]

    def action_ids(self, values: Any, field: str, max_len: int, count: int) -> list[int]:
        """The action ids of raw event types; a model without event types takes no `action_ids` (None)."""
        if self.events is None:
            if values is not None:
                raise InvalidRequest(field, "this model was trained without event types: leave it out")
            return [0] * count
        if values is None:
            raise InvalidRequest(field, "is missing")
        return [self.events.lookup(v, field, i) for i, v in enumerate(_array(values, field, max_len))]

    def user_features(self, values: Any, field: str) -> list[int]:
        """Feature ids of raw values, one per feature in `feature_names` order; null is unknown (0)."""
        if not self.features:
            raise InvalidRequest(field, "this model has no user features")
        values = _array(values, field, len(self.features))
        if len(values) != len(self.features):
            raise InvalidRequest(field, f"expected {len(self.features)} values ({', '.join(self.feature_names)}), "
                                        f"got {len(values)}")
        return [0 if v is None else m.lookup(v, field, i) for i, (v, m) in enumerate(zip(values, self.features,
                                                                                         strict=True))]


def _array(value: Any, field: str, max_len: int) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(field, f"must be an array, got {_json_type(value)}")
    if len(value) > max_len:
        raise InvalidRequest(field, f"{len(value)} values exceed the maximum {max_len}")
    return value
