"""Strict validation of request bodies: JSON types, required and unknown fields, id ranges, lengths.

Every problem raises `InvalidRequest(field, message)` before the engine is called, so a bad
request can never reach (or change) any user's cache entry. Dense ids must be JSON integers (not
floats, not booleans); raw ids (`id_space: "raw"`, the default of an instance serving a bundle) are
strings or integers mapped by the bundle's vocabularies (`serving.catalogue`). NaN/Infinity literals
are rejected while parsing.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mindspore_relaygr.config import RelayGRConfig
from mindspore_relaygr.errors import InvalidRequest
from mindspore_relaygr.model.inputs import HISTORY_FIELDS, MAX_ABS_TIMESTAMP, check_chronological
from serving import headers
from serving.catalogue import ID_SPACES, Catalogue

MAX_USER_ID_LEN = 256  # characters (code points), not bytes
# C0/C1 controls and DEL (category Cc), and lone surrogates, which have no UTF-8 form for the header.
_FORBIDDEN_IN_USER_ID = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
# A user id needs one character that shows: a letter, mark, number, punctuation or symbol (Unicode categories
# L, M, N, P, S). Ids of spaces, zero-width or format characters alone (U+200B, U+FEFF) look empty in every log.
_VISIBLE_CATEGORIES = frozenset("LMNPS")
# Characters of those categories that render as nothing: Unicode's Default_Ignorable_Code_Point outside the
# format and control categories (variation selectors, the combining grapheme joiner, the Hangul fillers,
# Mongolian variation selectors, ...; DerivedCoreProperties.txt) and the blank braille pattern U+2800.
_BLANK_VISIBLE = re.compile("[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2800\u3164\ufe00-\ufe0f\uffa0"
                            "\U000e0000-\U000e0fff]")
MAX_SHOWN_NAME = 64  # unknown field names are echoed back at most this long


@dataclass(frozen=True)
class Limits:
    """What a valid request may contain, from the model config."""

    num_items: int  # item ids are 1..num_items
    num_actions: int  # action ids are 0..num_actions-1
    user_feature_sizes: tuple[int, ...]
    max_history_len: int  # events (the user token is extra)
    min_history_len: int  # 1 without a user token: the model needs at least one token
    max_candidates: int
    catalogue: Catalogue | None = None  # the raw ids of a served bundle; None: dense ids only

    @classmethod
    def from_config(cls, config: RelayGRConfig, catalogue: Catalogue | None = None) -> Limits:
        m = config.model
        m.require_sizes()
        user_tokens = 1 if m.user_feature_sizes else 0
        return cls(m.num_items, m.num_actions, tuple(m.user_feature_sizes), m.max_seq_len - user_tokens,
                   1 - user_tokens, m.max_candidates, catalogue)

    @property
    def default_id_space(self) -> str:
        """raw when the instance has its bundle's vocabularies, else dense."""
        return "dense" if self.catalogue is None else "raw"


@dataclass(frozen=True)
class PreinferRequest:
    user_id: str
    history: dict[str, list[int]]  # dense ids
    num_candidates: int | None
    id_space: str = "dense"


@dataclass(frozen=True)
class RankRequest:
    user_id: str
    history: dict[str, list[int]]  # dense ids
    candidate_ids: list[int]  # dense ids
    top_k: int | None
    id_space: str = "dense"
    raw_candidates: list[int | str] | None = None  # the request's candidate ids (raw id space)

    @property
    def shown_candidates(self) -> list[int | str]:
        """The candidates in the request's id space (what `ranked_item_ids` answers in)."""
        return self.candidate_ids if self.raw_candidates is None else self.raw_candidates


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: bytes) -> Any:
    """Decode a request body; malformed JSON, NaN/Infinity and absurd nesting are `body` errors."""
    if not data:
        raise InvalidRequest("body", "is empty; expected a JSON object")
    try:
        return json.loads(data, parse_constant=_reject_constant)
    except RecursionError:
        raise InvalidRequest("body", "JSON is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise InvalidRequest("body", f"malformed JSON: {str(exc)[:200]}") from None


def _shown(name: str) -> str:
    return name if len(name) <= MAX_SHOWN_NAME else name[:MAX_SHOWN_NAME] + "..."


def _object(value: Any, name: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict[str, Any]:
    """`value` as a JSON object with exactly the allowed keys (`name` is "" for the body)."""
    if not isinstance(value, dict):
        raise InvalidRequest(name or "body", f"must be a JSON object, got {_json_type(value)}")
    prefix = f"{name}." if name else ""
    required = tuple(required)
    for key in required:
        if key not in value:
            raise InvalidRequest(prefix + key, "is missing")
    allowed = set(required) | set(optional)
    for key in value:
        if key not in allowed:
            raise InvalidRequest(_shown(prefix + key), f"unknown field; allowed: {sorted(allowed)}")
    return value


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _int_list(value: Any, name: str, low: int, high: int, max_len: int) -> list[int]:
    """A JSON array of integers in [low, high], at most `max_len` long."""
    if not isinstance(value, list):
        raise InvalidRequest(name, f"must be an array of integers, got {_json_type(value)}")
    if len(value) > max_len:
        raise InvalidRequest(name, f"{len(value)} values exceed the maximum {max_len}")
    if not all(type(v) is int for v in value):  # bool is not int here
        i, bad = next((i, v) for i, v in enumerate(value) if type(v) is not int)
        raise InvalidRequest(name, f"value at index {i} must be an integer, got {_json_type(bad)}")
    if value and (min(value) < low or max(value) > high):
        i, bad = next((i, v) for i, v in enumerate(value) if not low <= v <= high)
        raise InvalidRequest(name, f"value {_shown(str(bad))} at index {i} is out of range [{low}, {high}]")
    return value


def _optional_int(body: dict[str, Any], name: str, low: int, high: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise InvalidRequest(name, f"must be an integer, got {_json_type(value)}")
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f", at most {high}"
        raise InvalidRequest(name, f"must be at least {low}{upper}, got {_shown(str(value))}")
    return value


def _check_user_id(user_id: str, field: str) -> None:
    """1..MAX_USER_ID_LEN characters (code points, not bytes) with no control character or lone surrogate, and
    at least one visible character."""
    if not 1 <= len(user_id) <= MAX_USER_ID_LEN or _FORBIDDEN_IN_USER_ID.search(user_id):
        raise InvalidRequest(field, f"must be 1..{MAX_USER_ID_LEN} characters without control characters")
    if not any(unicodedata.category(ch)[0] in _VISIBLE_CATEGORIES and not _BLANK_VISIBLE.match(ch) for ch in user_id):
        raise InvalidRequest(field, "must contain a visible character (a letter, digit, punctuation or symbol), "
                                    "not only spaces or invisible characters")


def parse_user_id(body: dict[str, Any], affinity: str | None) -> str:
    """The body's user_id, else the (decoded) affinity header; when both are given they must agree."""
    header_id = None
    if affinity:  # absent or empty: no header
        try:
            header_id = headers.decode_affinity(affinity)
        except ValueError as exc:
            raise InvalidRequest(headers.AFFINITY, f"is not percent-encoded UTF-8: {exc}") from None
        _check_user_id(header_id, headers.AFFINITY)
    user_id = body.get("user_id")
    if user_id is None:
        if header_id is None:
            raise InvalidRequest("user_id", f"is missing (send it in the body or the {headers.AFFINITY} header)")
        return header_id
    if not isinstance(user_id, str):
        raise InvalidRequest("user_id", f"must be a string, got {_json_type(user_id)}")
    _check_user_id(user_id, "user_id")
    if header_id is not None and header_id != user_id:
        raise InvalidRequest("user_id", f"differs from the (percent-decoded) {headers.AFFINITY} header; the load "
                                        "balancer routes on the header, so both must name the same user")
    return user_id


def parse_id_space(body: dict[str, Any], limits: Limits) -> str:
    """The body's `id_space` ("raw" | "dense"; default: raw with a bundle's vocabularies, else dense)."""
    space = body.get("id_space", limits.default_id_space)
    if space not in ID_SPACES:
        raise InvalidRequest("id_space", f"must be one of {list(ID_SPACES)}, got {_shown(repr(space))}")
    if space == "raw" and limits.catalogue is None:
        raise InvalidRequest("id_space", "raw ids need the vocabularies of a bundle: this instance serves a config "
                                         "(relaygr serve --bundle DIR serves the catalogue's ids); send dense ids")
    return space


def parse_history(value: Any, limits: Limits, name: str = "history", id_space: str = "dense") -> dict[str, list[int]]:
    """{item_ids, action_ids, timestamps, user_features?} with equal lengths, ids in range, oldest event first;
    raw ids (`id_space` "raw") are mapped to dense ones by the catalogue first."""
    cat = limits.catalogue if id_space == "raw" else None
    no_events = cat is not None and cat.events is None
    required = [f for f in HISTORY_FIELDS if not (no_events and f == "action_ids")]
    obj = _object(value, name, required, ("user_features", *(("action_ids",) if no_events else ())))
    n = limits.max_history_len
    if cat is not None:
        obj = dict(obj)
        obj["item_ids"] = cat.item_ids(obj["item_ids"], f"{name}.item_ids", n)
        count = len(obj["item_ids"])
        obj["action_ids"] = cat.action_ids(obj.get("action_ids"), f"{name}.action_ids", n, count)
        if obj.get("user_features") is not None:
            obj["user_features"] = cat.user_features(obj["user_features"], f"{name}.user_features")
    out = {
        "item_ids": _int_list(obj["item_ids"], f"{name}.item_ids", 1, limits.num_items, n),
        "action_ids": _int_list(obj["action_ids"], f"{name}.action_ids", 0, limits.num_actions - 1, n),
        "timestamps": _int_list(obj["timestamps"], f"{name}.timestamps", 0, MAX_ABS_TIMESTAMP - 1, n),
    }
    lengths = [len(v) for v in out.values()]
    if len(set(lengths)) != 1:
        raise InvalidRequest(name, f"item_ids, action_ids and timestamps differ in length {tuple(lengths)}")
    check_chronological(f"{name}.timestamps", out["timestamps"])
    if lengths[0] < limits.min_history_len:
        raise InvalidRequest(f"{name}.item_ids", f"needs at least {limits.min_history_len} event(s)")
    features = obj.get("user_features")
    if features is not None:
        field = f"{name}.user_features"
        sizes = limits.user_feature_sizes
        if not sizes:
            raise InvalidRequest(field, "this model has no user features")
        feats = _int_list(features, field, 0, max(sizes) - 1, len(sizes))
        if len(feats) != len(sizes):
            raise InvalidRequest(field, f"expected {len(sizes)} values, got {len(feats)}")
        for i, (v, size) in enumerate(zip(feats, sizes, strict=True)):
            if v >= size:
                raise InvalidRequest(field, f"value {v} at index {i} is out of range [0, {size - 1}]")
        out["user_features"] = feats
    return out


def parse_preinfer(body: Any, limits: Limits, affinity: str | None = None) -> PreinferRequest:
    """POST /v1/preinfer: {user_id, history, num_candidates?, id_space?}."""
    body = _object(body, "", ("history",), ("user_id", "num_candidates", "id_space"))
    user_id = parse_user_id(body, affinity)
    space = parse_id_space(body, limits)
    return PreinferRequest(user_id, parse_history(body["history"], limits, id_space=space),
                           _optional_int(body, "num_candidates", 1, limits.max_candidates), space)


def parse_rank(body: Any, limits: Limits, affinity: str | None = None) -> RankRequest:
    """POST /v1/rank: {user_id, history, candidates: {item_ids}, top_k?, id_space?}; top_k above the count is
    clamped."""
    body = _object(body, "", ("history", "candidates"), ("user_id", "top_k", "id_space"))
    user_id = parse_user_id(body, affinity)
    space = parse_id_space(body, limits)
    history = parse_history(body["history"], limits, id_space=space)
    cands = _object(body["candidates"], "candidates", ("item_ids",))
    raw = None
    if space == "raw":
        raw = cands["item_ids"]
        cands = {"item_ids": limits.catalogue.item_ids(raw, "candidates.item_ids", limits.max_candidates)}
    ids = _int_list(cands["item_ids"], "candidates.item_ids", 1, limits.num_items, limits.max_candidates)
    if not ids:
        raise InvalidRequest("candidates.item_ids", "must not be empty")
    top_k = _optional_int(body, "top_k", 1, None)
    return RankRequest(user_id, history, ids, None if top_k is None else min(top_k, len(ids)), space, raw)
