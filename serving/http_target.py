"""HTTP senders for the open-loop load generator: replay a workload against an instance or nginx.

    target = HTTPTarget("http://127.0.0.1:8080", workload)
    target.prepare(workload.requests)  # encode every body before the clock starts
    outcomes = run_open_loop(workload, target.preinfer, target.rank)

Each worker thread of the load generator keeps its own `http.client` connection alive (no proxy:
the benchmarks talk to loopback). `http.client` rather than `requests`: a request costs the client
about 1.5 ms less CPU (measured on an idle instance: a 400 took 3.2 ms through `requests`, 1.5 ms
through `http.client`), which the benchmarks would otherwise count as the server's latency on
cores the server shares. A kept-alive connection the server has closed is noticed before reuse
(its socket reads as ready) and reopened, as urllib3 does. A pre-infer maps to (trigger reason,
False, status), a rank to (cache tier, truncated, status); a non-2xx answer keeps its status (a 503
is a rejection, anything else an error) and a connection error or timeout raises (`OSError` or
`http.client.HTTPException`), which the load generator records as an error outcome. The instance
that answered (X-RelayGR-Instance) is counted per call and per request, so a run can report how
often a user's rank met its pre-infer.
"""

from __future__ import annotations

import http.client
import json
import select
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mindspore_relaygr.bench.workload import Request, Workload
from serving import headers  # the header names only (a constants module: no Flask)

JSON_CONTENT = {"Content-Type": "application/json"}


def user_id(user: int) -> str:
    """The user id the benchmarks send for workload user `user` (same as the in-process bench)."""
    return f"user-{user}"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, read in full."""

    status: int
    headers: dict[str, str]  # names lower-cased
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body)


class KeptAliveConnection:
    """One HTTP/1.1 connection to host:port, reopened when the server has closed it."""

    def __init__(self, host: str, port: int, connect_timeout_s: float, read_timeout_s: float) -> None:
        self._conn = http.client.HTTPConnection(host, port, timeout=connect_timeout_s)
        self._read_timeout_s = read_timeout_s

    def post(self, path: str, body: bytes, hdrs: dict[str, str]) -> Answer:
        if self._conn.sock is not None and _closed_by_peer(self._conn.sock):
            self._conn.close()
        if self._conn.sock is None:
            self._conn.connect()
            self._conn.sock.settimeout(self._read_timeout_s)
        try:
            self._conn.request("POST", path, body=body, headers=hdrs)
            resp = self._conn.getresponse()
            data = resp.read()
        except BaseException:
            self._conn.close()  # a half-used connection is never reused
            raise
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)

    def close(self) -> None:
        self._conn.close()


def _closed_by_peer(sock) -> bool:
    """An idle kept-alive socket that reads as ready has been closed (or sent junk): do not reuse it."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


class HTTPTarget:
    """Senders (`preinfer`, `rank`) for `run_open_loop` against one base URL."""

    def __init__(self, base_url: str, workload: Workload, top_k: int = 10,
                 timeout_s: tuple[float, float] = (2.0, 120.0)) -> None:
        self.base_url = base_url.rstrip("/")
        url = urlsplit(self.base_url)
        if url.scheme != "http" or url.hostname is None:
            raise ValueError(f"HTTPTarget needs an http://host:port URL, got {base_url!r}")
        self._host, self._port, self._path_prefix = url.hostname, url.port or 80, url.path
        self.workload = workload
        self.top_k = top_k
        self.timeout_s = timeout_s  # (connect, read)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[KeptAliveConnection] = []
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
        if resp.status != 202:
            return f"http_{resp.status}", False, resp.status
        return str(resp.json()["reason"]), False, resp.status

    def rank(self, req: Request) -> tuple[str, bool, int]:
        resp = self._post("/v1/rank", "rank", req)
        if resp.status != 200:
            return f"http_{resp.status}", False, resp.status
        body = resp.json()
        return str(body["cache"]), bool(body["truncated"]), resp.status

    def _post(self, path: str, kind: str, req: Request) -> Answer:
        hdrs = {**JSON_CONTENT, headers.AFFINITY: headers.encode_affinity(user_id(req.user))}
        resp = self._connection().post(self._path_prefix + path, self._body(kind, req), hdrs)
        instance = resp.headers.get(headers.INSTANCE.lower(), "")
        with self._lock:
            self.calls[(kind, instance or "?")] += 1
            if resp.ok and instance:
                self._placement.setdefault(req, {})[kind] = instance
        return resp

    def _connection(self) -> KeptAliveConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = KeptAliveConnection(self._host, self._port, *self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

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
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
