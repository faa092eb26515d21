"""Seeded generator of hostile requests, each invalid by construction (every one must get a 4xx).

Used against the Flask test client (fast) and against live gunicorn instances (slow). Half of the
probes carry the known user's id, to show that bad input never touches that user's cache entry.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from serving import headers
from serving.schemas import Limits
from tests.serving.conftest import make_history

EXPECTED_STATUSES = {400, 404, 405, 413}


@dataclass(frozen=True)
class Probe:
    method: str
    path: str
    body: bytes | None
    what: str
    headers: dict[str, str] = field(default_factory=dict)


def _bad_elements(limits: Limits) -> dict[str, list]:
    return {
        "item_ids": [-1, 0, limits.num_items + 1, 10**20, 1.5, 2.0, True, None, "3", [1], {}],
        "action_ids": [-1, limits.num_actions, 10**19, 0.0, False, "0", None],
        "timestamps": [-1, 2**41, 1.7e9, None, "1700000000", [], True],
        "user_features": [-1, 99, 1.0, None, "1"],
        "candidates": [0, -7, limits.num_items + 1, 3.0, None, True, "5"],
    }


class HostileRequests:
    """`probes(count)` -> invalid requests for /v1/rank and /v1/preinfer (and wrong routes/methods)."""

    def __init__(self, seed: int, limits: Limits, known_user: str, max_body: int) -> None:
        self.rng = random.Random(seed)
        self.limits = limits
        self.known_user = known_user
        self.max_body = max_body
        self.bad = _bad_elements(limits)
        self.mutations: list[tuple[int, Callable[[str, dict], Probe]]] = [
            (3, self._garbage), (2, self._nan), (1, self._deep), (4, self._drop), (4, self._wrong_type),
            (6, self._bad_element), (2, self._length_mismatch), (2, self._too_long), (3, self._candidates),
            (3, self._bad_option), (3, self._unknown_field), (2, self._affinity), (2, self._wrong_route),
            (1, self._oversize),
        ]

    def probes(self, count: int) -> list[Probe]:
        weights = [w for w, _ in self.mutations]
        out = []
        for _ in range(count):
            (_, mutate), = self.rng.choices(self.mutations, weights)
            endpoint = self.rng.choice(["/v1/rank", "/v1/preinfer"])
            out.append(mutate(endpoint, self._base(endpoint)))
        return out

    # ------------------------------------------------------------------ helpers
    def _base(self, endpoint: str) -> dict:
        user = self.known_user if self.rng.random() < 0.5 else f"fuzz-{self.rng.randrange(10**6)}"
        n = self.rng.randint(1, min(60, self.limits.max_history_len))
        body = {"user_id": user, "history": make_history(n, self.rng.randrange(10**6), self.limits.num_items,
                                                         self.limits.num_actions, user_features=[1, 2])}
        if endpoint == "/v1/rank":
            m = self.rng.randint(1, self.limits.max_candidates)
            body["candidates"] = {"item_ids": [self.rng.randint(1, self.limits.num_items) for _ in range(m)]}
        return body

    def _probe(self, endpoint: str, body: dict | bytes, what: str, hdrs: dict | None = None) -> Probe:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return Probe("POST", endpoint, data, what,
                     {"Content-Type": "application/json", **_preinfer_affinity(endpoint, body), **(hdrs or {})})

    # ------------------------------------------------------------------ mutations
    def _garbage(self, endpoint: str, body: dict) -> Probe:
        valid = json.dumps(body).encode()
        choice = self.rng.choice([b"", b"{", b"null", b"[]", b'"x"', b"123", b"true", b"\xff\xfe\x00{",
                                  self.rng.randbytes(self.rng.randint(1, 200)),
                                  valid[: self.rng.randint(1, len(valid) - 1)]])
        return self._probe(endpoint, choice, f"garbage body {choice[:30]!r}")

    def _nan(self, endpoint: str, body: dict) -> Probe:
        stamp = str(body["history"]["timestamps"][-1])
        literal = self.rng.choice(["NaN", "Infinity", "-Infinity"])
        return self._probe(endpoint, json.dumps(body).replace(stamp, literal, 1).encode(), f"{literal} timestamp")

    def _deep(self, endpoint: str, body: dict) -> Probe:
        depth = self.rng.choice([500, 5000, 100000])
        nested = b"[" * depth + b"]" * depth
        return self._probe(endpoint, b'{"user_id": "x", "history": ' + nested + b"}", f"nesting depth {depth}")

    def _drop(self, endpoint: str, body: dict) -> Probe:
        paths = [("history",), ("history", "item_ids"), ("history", "action_ids"), ("history", "timestamps"),
                 ("user_id",)]
        if endpoint == "/v1/rank":
            paths += [("candidates",), ("candidates", "item_ids")]
        path = self.rng.choice(paths)
        target = body
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        return self._probe(endpoint, body, f"missing {'.'.join(path)}")

    def _wrong_type(self, endpoint: str, body: dict) -> Probe:
        key = self.rng.choice(["user_id", "history", "item_ids", "action_ids", "timestamps", "user_features"]
                              + (["candidates", "cand_ids"] if endpoint == "/v1/rank" else []))
        if key == "user_id":
            value = self.rng.choice([5, 1.5, True, [], {}, "", "x" * 300, "a\nb", "tab\tuser"])
            body["user_id"] = value
        elif key in ("history", "candidates"):
            value = self.rng.choice([None, 5, "h", [], True, [1, 2]])
            body[key] = value
        else:
            value = self.rng.choice([None, 5, "1,2", {}, True, 1.5] + ([[]] if key == "user_features" else []))
            target = body["candidates"] if key == "cand_ids" else body["history"]
            target["item_ids" if key == "cand_ids" else key] = value
            if value is None and key in ("user_features",):  # null user_features is valid: make it wrong
                target[key] = "none"
        return self._probe(endpoint, body, f"{key} = {value!r:.40}")

    def _bad_element(self, endpoint: str, body: dict) -> Probe:
        key = self.rng.choice(["item_ids", "action_ids", "timestamps", "user_features"]
                              + (["candidates"] if endpoint == "/v1/rank" else []))
        target = body["candidates"]["item_ids"] if key == "candidates" else body["history"][key]
        i = self.rng.randrange(len(target))
        target[i] = copy.deepcopy(self.rng.choice(self.bad[key]))
        return self._probe(endpoint, body, f"{key}[{i}] = {target[i]!r:.40}")

    def _length_mismatch(self, endpoint: str, body: dict) -> Probe:
        key = self.rng.choice(["item_ids", "action_ids", "timestamps"])
        hist = body["history"]
        if len(hist[key]) > 1 and self.rng.random() < 0.5:
            hist[key].pop()
        else:
            hist[key].append(hist[key][-1])
        return self._probe(endpoint, body, f"{key} length differs")

    def _too_long(self, endpoint: str, body: dict) -> Probe:
        n = self.limits.max_history_len + 1 + self.rng.randint(0, 50)
        body["history"] = make_history(n, 1, self.limits.num_items, self.limits.num_actions, user_features=[1, 2])
        return self._probe(endpoint, body, f"history of {n} events")

    def _candidates(self, endpoint: str, body: dict) -> Probe:
        m = self.rng.choice([0, self.limits.max_candidates + 1, self.limits.max_candidates + 1000, 20000])
        ids = [self.rng.randint(1, self.limits.num_items) for _ in range(m)]
        body = self._base("/v1/rank")
        body["candidates"] = {"item_ids": ids}
        return self._probe("/v1/rank", body, f"{m} candidates")

    def _bad_option(self, endpoint: str, body: dict) -> Probe:
        if endpoint == "/v1/rank":
            key, value = "top_k", self.rng.choice([0, -1, "5", 1.5, True, [], {}])
        else:
            key, value = "num_candidates", self.rng.choice([0, -3, self.limits.max_candidates + 1, "2", 2.5, False])
        body[key] = value
        return self._probe(endpoint, body, f"{key} = {value!r}")

    def _unknown_field(self, endpoint: str, body: dict) -> Probe:
        where = self.rng.choice(["body", "history"] + (["candidates"] if endpoint == "/v1/rank" else []))
        name = self.rng.choice(["extra", "topk", "userid", "x" * 500, "item_id", "candidates_ids"])
        (body if where == "body" else body[where])[name] = 1
        return self._probe(endpoint, body, f"unknown field {where}.{name[:20]}")

    def _affinity(self, endpoint: str, body: dict) -> Probe:
        value = self.rng.choice([body["user_id"] + "-other", "y" * 300])
        return self._probe(endpoint, body, f"affinity header {value[:20]!r}", {headers.AFFINITY: value})

    def _wrong_route(self, endpoint: str, body: dict) -> Probe:
        method, path = self.rng.choice([
            ("GET", endpoint), ("PUT", endpoint), ("DELETE", endpoint), ("PATCH", endpoint),
            ("POST", "/healthz"), ("POST", "/metrics"), ("GET", "/v1/admin/flush"), ("DELETE", "/v1/stats"),
            ("POST", "/v2/rank"), ("POST", "/v1/rank/extra"), ("GET", f"/v1/{self.rng.randrange(10**9)}"),
            ("POST", "/v1/ranking"), ("GET", "/"),
        ])
        return Probe(method, path, json.dumps(body).encode(), f"{method} {path}",
                     {"Content-Type": "application/json"})

    def _oversize(self, endpoint: str, body: dict) -> Probe:
        body["padding"] = "p" * (self.max_body + 1)
        return self._probe(endpoint, body, "body over the size limit")


def _preinfer_affinity(endpoint: str, body: dict | bytes) -> dict[str, str]:
    """The affinity header a pre-infer needs to have its body checked at all (without it, a 400 on the header):
    its body's user id, or a fixed one for a body that is not an object with one (never a valid request)."""
    if endpoint != "/v1/preinfer" or (isinstance(body, dict) and "user_id" not in body):
        return {}
    user_id = body.get("user_id") if isinstance(body, dict) else None
    try:
        return {headers.AFFINITY: headers.encode_affinity(user_id) if isinstance(user_id, str) and user_id else "fuzz"}
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 form
        return {headers.AFFINITY: "fuzz"}
