"""HTTP senders for the open-loop load generator: replay a workload against an instance or nginx.

    target = HTTPTarget("http://127.0.0.1:8080", workload)
    target.prepare(workload.requests)  # encode every body before the clock starts
    outcomes = run_open_loop(workload, target.preinfer, target.rank)

Each worker thread of the load generator gets its own `requests.Session` (kept-alive connections,
proxy variables ignored: the benchmarks talk to loopback). A pre-infer maps to (trigger reason,
False, status), a rank to (cache tier, truncated, status); a non-2xx answer keeps its status (a 503
is a rejection, anything else an error) and a connection error or timeout raises, which the load
generator records as an error outcome. The instance that answered (X-RelayGR-Instance) is counted
per call and per request, so a run can report how often a user's rank met its pre-infer.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import requests

from mindspore_relaygr.bench.workload import Request, Workload
from serving import headers  # the header names only (a constants module: no Flask)

JSON_CONTENT = {"Content-Type": "application/json"}


def user_id(user: int) -> str:
    """The user id the benchmarks send for workload user `user` (same as the in-process bench)."""
    return f"user-{user}"


class HTTPTarget:
    """Senders (`preinfer`, `rank`) for `run_open_loop` against one base URL."""

    def __init__(self, base_url: str, workload: Workload, top_k: int = 10,
                 timeout_s: tuple[float, float] = (2.0, 120.0)) -> None:
        self.base_url = base_url.rstrip("/")
        self.workload = workload
        self.top_k = top_k
        self.timeout_s = timeout_s  # (connect, read)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list[requests.Session] = []
        self._bodies: dict[tuple[str, Request], bytes] = {}
        self.calls: Counter[tuple[str, str]] = Counter()  # (kind, instance) -> answers
        self._placement: dict[Request, dict[str, str]] = {}  # request -> {kind: instance}

    # ------------------------------------------------------------------ bodies
    def prepare(self, requests_: list[Request]) -> None:
        """Encode the pre-infer and rank bodies of these requests now, off the measured path."""
        for req in requests_:
            for kind in ("preinfer", "rank"):
                self._body(kind, req)

    def _body(self, kind: str, req: Request) -> bytes:
        key = (kind, req)
        body = self._bodies.get(key)
        if body is None:
            hist = {k: v.tolist() for k, v in self.workload.history(req).items()}
            doc: dict[str, Any] = {"user_id": user_id(req.user), "history": hist}
            if kind == "preinfer":
                doc["num_candidates"] = self.workload.spec.num_candidates
            else:
                doc["candidates"] = {"item_ids": self.workload.candidates(req).tolist()}
                doc["top_k"] = self.top_k
            body = json.dumps(doc).encode()
            with self._lock:
                self._bodies[key] = body
        return body

    # ------------------------------------------------------------------ senders
    def preinfer(self, req: Request) -> tuple[str, bool, int]:
        resp = self._post("/v1/preinfer", "preinfer", req)
        if resp.status_code != 202:
            return f"http_{resp.status_code}", False, resp.status_code
        return str(resp.json()["reason"]), False, resp.status_code

    def rank(self, req: Request) -> tuple[str, bool, int]:
        resp = self._post("/v1/rank", "rank", req)
        if resp.status_code != 200:
            return f"http_{resp.status_code}", False, resp.status_code
        body = resp.json()
        return str(body["cache"]), bool(body["truncated"]), resp.status_code

    def _post(self, path: str, kind: str, req: Request) -> requests.Response:
        hdrs = {**JSON_CONTENT, headers.AFFINITY: headers.encode_affinity(user_id(req.user))}
        resp = self._session().post(self.base_url + path, data=self._body(kind, req), headers=hdrs,
                                    timeout=self.timeout_s)
        instance = resp.headers.get(headers.INSTANCE, "")
        with self._lock:
            self.calls[(kind, instance or "?")] += 1
            if resp.ok and instance:
                self._placement.setdefault(req, {})[kind] = instance
        return resp

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.trust_env = False  # loopback: never through an HTTP(S)_PROXY from the environment
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    # ------------------------------------------------------------------ results
    def instance_counts(self) -> dict[str, dict[str, int]]:
        """{kind: {instance: answers}} as seen by the client ("?" = no instance header, e.g. nginx's 503)."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (kind, instance), n in sorted(self.calls.items()):
                out.setdefault(kind, {})[instance] = n
        return out

    def colocated_fraction(self) -> float | None:
        """Of the requests whose pre-infer and rank both succeeded, the fraction answered by one
        instance (None when no request had both)."""
        with self._lock:
            both = [p for p in self._placement.values() if "preinfer" in p and "rank" in p]
        if not both:
            return None
        return sum(p["preinfer"] == p["rank"] for p in both) / len(both)

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()
