"""A small Python client of the RelayGR HTTP API (`requests`, one kept-alive session).

    client = RelayGRClient("http://127.0.0.1:8080")
    client.wait_ready(timeout_s=600)
    client.preinfer("u1", prefix_history, num_candidates=101)
    result = client.rank("u1", history, candidate_ids, top_k=10)

Ids go as given: the catalogue's raw ids (strings or integers: item ids, event types as `action_ids`, user-feature
values) to an instance serving a bundle, dense integer ids to one serving a config; `id_space="dense"` (per client
or per call) sends dense ids to a bundle's instance (see docs/serving.md, "Ids").

Every call sends the user id in the body and in the affinity header (percent-encoded UTF-8, see
`serving.headers.encode_affinity`; any Unicode id works), so a load balancer hashing on the header
routes the pre-infer and the rank of one user to the same instance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from serving import headers


class APIError(RuntimeError):
    """A non-2xx answer; `status` and the decoded JSON `body` (if any) are kept."""

    def __init__(self, status: int, body: Any, url: str) -> None:
        detail = body
        if isinstance(body, dict) and "error" in body:
            detail = f"{body['field']}: {body['error']}" if body.get("field") else body["error"]
        super().__init__(f"{url}: HTTP {status}: {detail}")
        self.status, self.body = status, body


@dataclass(frozen=True)
class Timed:
    """A decoded JSON answer with the client-side wall time of the call."""

    body: dict[str, Any]
    client_ms: float
    instance: str | None


def _json_id(value: Any) -> int | str | None:
    """An id as JSON: text stays text, integers (numpy's too) become ints, None stays null (an unknown feature)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"an id must be a string or an integer, got {value!r}")
    return int(value)


def _history_json(history: Mapping[str, Any] | Any) -> dict[str, list[Any]]:
    """A JSON history from a dict of id lists or a `History` (arrays as attributes); `action_ids` may be absent
    (a model trained without event types, raw ids)."""
    get = history.get if isinstance(history, Mapping) else lambda k: getattr(history, k, None)
    out = {k: [_json_id(x) for x in get(k)] for k in ("item_ids", "action_ids", "timestamps") if get(k) is not None}
    feats = get("user_features")
    if feats is not None:
        out["user_features"] = [_json_id(x) for x in feats]
    return out


class RelayGRClient:
    """preinfer / rank / readiness against one base URL (an instance, or nginx in front of several)."""

    def __init__(self, base_url: str, timeout_s: float = 120.0, id_space: str | None = None) -> None:
        """`id_space`: "raw" or "dense" on every call (None: the instance's default, raw for a bundle)."""
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.id_space = id_space
        self.session = requests.Session()
        self.session.trust_env = False  # never send 127.0.0.1 traffic through an HTTP proxy

    def close(self) -> None:
        self.session.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, user_id: str | None = None,
              ok: Sequence[int] = (200, 202)) -> Timed:
        url = self.base_url + path
        hdrs = {headers.AFFINITY: headers.encode_affinity(user_id)} if user_id else {}
        t0 = time.perf_counter()
        resp = self.session.request(method, url, json=body, headers=hdrs, timeout=self.timeout_s)
        client_ms = (time.perf_counter() - t0) * 1e3
        try:
            decoded = resp.json()
        except ValueError:
            decoded = resp.text[:500]
        if resp.status_code not in ok or not isinstance(decoded, dict):
            raise APIError(resp.status_code, decoded, url)
        return Timed(decoded, client_ms, resp.headers.get(headers.INSTANCE))

    def ready(self) -> dict[str, Any]:
        """GET /readyz (503 while warming up is an answer, not an error)."""
        return self._call("GET", "/readyz", ok=(200, 503)).body

    def wait_ready(self, timeout_s: float = 900.0, poll_s: float = 1.0,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Poll /readyz until the engine is ready; raise TimeoutError (or APIError if it failed)."""
        deadline = time.monotonic() + timeout_s
        last_report = 0.0
        while True:
            try:
                state = self.ready()
            except requests.ConnectionError:
                state = {"status": "not listening yet"}
            if state.get("status") == "ready":
                return state
            if state.get("status") == "failed":
                raise APIError(503, state, self.base_url + "/readyz")
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{self.base_url} not ready after {timeout_s:.0f} s (last: {state})")
            if progress is not None and now - last_report >= 10:
                progress(f"waiting for {self.base_url}: {state.get('status')}")
                last_report = now
            time.sleep(poll_s)

    def _with_space(self, body: dict[str, Any], id_space: str | None) -> dict[str, Any]:
        space = id_space or self.id_space
        if space is not None:
            body["id_space"] = space
        return body

    def preinfer(self, user_id: str, history: Mapping[str, Any] | Any, num_candidates: int | None = None,
                 id_space: str | None = None) -> Timed:
        """POST /v1/preinfer: ask the instance to relay this prefix (answers 202 at once)."""
        body: dict[str, Any] = {"user_id": user_id, "history": _history_json(history)}
        if num_candidates is not None:
            body["num_candidates"] = int(num_candidates)
        return self._call("POST", "/v1/preinfer", self._with_space(body, id_space), user_id)

    def rank(self, user_id: str, history: Mapping[str, Any] | Any, candidate_ids: Sequence[int | str],
             top_k: int | None = None, id_space: str | None = None) -> Timed:
        """POST /v1/rank: scores (request order), ranking, ranked_item_ids (in the ids sent), cache tier, server
        timings."""
        body: dict[str, Any] = {"user_id": user_id, "history": _history_json(history),
                                "candidates": {"item_ids": [_json_id(x) for x in candidate_ids]}}
        if top_k is not None:
            body["top_k"] = int(top_k)
        return self._call("POST", "/v1/rank", self._with_space(body, id_space), user_id, ok=(200,))
