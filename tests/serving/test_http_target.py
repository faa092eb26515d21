"""HTTP senders of the load generator: against a scripted stub server (exact wire behaviour) and the
real Flask app on a FakeEngine (status and tier mapping through the real API). No MindSpore."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from werkzeug.serving import make_server
from werkzeug.wsgi import LimitedStream

from mindspore_relaygr.bench.loadgen import run_open_loop, summarize
from mindspore_relaygr.bench.workload import Workload, WorkloadSpec
from mindspore_relaygr.config import load_config
from serving import headers
from serving.app import create_app
from serving.http_target import HTTPTarget, user_id
from serving.settings import resolve_settings
from tests.conftest import CONFIGS
from tests.serving.fake_engine import FakeEngine

SPEC = WorkloadSpec(num_users=4, num_requests=8, qps=200.0, median_len=40, length_sigma=0.3, min_len=10, max_len=100,
                    gap_ms=2.0, num_candidates=8, num_items=200, num_actions=4, seed=3)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return Workload.generate(SPEC)


# ---------------------------------------------------------------------- a scripted stub server
class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), StubHandler)
        self.seen: list[dict] = []  # one per request: path, headers, body, client port
        self.answers: dict[str, tuple[int, dict, dict]] = {}  # path -> (status, body, extra headers)
        self.lock = threading.Lock()
        self.hang_up = False  # close each connection after its answer, without saying so (a keep-alive timeout)
        self.hung_up = threading.Semaphore(0)  # released once per connection closed that way

    def shutdown_request(self, request) -> None:
        super().shutdown_request(request)  # the socket is closed here, after the handler has returned
        if self.hang_up:
            self.hung_up.release()


class StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so connections show which session sent what

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.seen.append({"path": self.path, "headers": dict(self.headers), "body": body,
                                     "port": self.client_address[1]})
        status, answer, extra = self.server.answers[self.path]
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
        if self.server.hang_up:
            self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def stub_server() -> Iterator[tuple[Stub, str]]:
    server = Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_bodies_headers_and_mapping_on_the_wire(workload, monkeypatch):
    # A proxy in the environment must be ignored (loopback traffic), even for 127.0.0.1.
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    req = workload.requests[0]
    with stub_server() as (stub, url):
        stub.answers["/v1/preinfer"] = (202, {"admitted": True, "reason": "admitted"}, {headers.INSTANCE: "a"})
        stub.answers["/v1/rank"] = (200, {"cache": "dram", "truncated": True}, {headers.INSTANCE: "b"})
        target = HTTPTarget(url, workload, top_k=3)
        assert target.preinfer(req) == ("admitted", False, 202)
        assert target.rank(req) == ("dram", True, 200)
        target.close()
    pre, rank = stub.seen
    hist = {k: v.tolist() for k, v in workload.history(req).items()}
    assert pre["path"] == "/v1/preinfer" and rank["path"] == "/v1/rank"
    assert pre["body"] == {"user_id": user_id(req.user), "history": hist, "num_candidates": SPEC.num_candidates}
    assert rank["body"] == {"user_id": user_id(req.user), "history": hist,
                            "candidates": {"item_ids": workload.candidates(req).tolist()}, "top_k": 3}
    for seen in (pre, rank):
        assert seen["headers"][headers.AFFINITY] == user_id(req.user)
        assert seen["headers"]["Content-Type"] == "application/json"
    assert target.instance_counts() == {"preinfer": {"a": 1}, "rank": {"b": 1}}
    assert target.colocated_fraction() == 0.0  # pre-infer on a, rank on b


def test_non_2xx_keeps_its_status_and_503_without_instance_header(workload):
    req = workload.requests[1]
    with stub_server() as (stub, url):
        stub.answers["/v1/preinfer"] = (503, {"error": "no RelayGR instance is available"}, {})
        stub.answers["/v1/rank"] = (503, {"error": "no RelayGR instance is available"}, {})
        target = HTTPTarget(url, workload)
        assert target.preinfer(req) == ("http_503", False, 503)
        assert target.rank(req) == ("http_503", False, 503)
        stub.answers["/v1/rank"] = (500, {"error": "boom"}, {headers.INSTANCE: "i0"})
        assert target.rank(req) == ("http_500", False, 500)
        target.close()
    assert target.instance_counts() == {"preinfer": {"?": 1}, "rank": {"?": 1, "i0": 1}}
    assert target.colocated_fraction() is None  # nothing succeeded


def test_one_session_per_worker_thread(workload):
    with stub_server() as (stub, url):
        stub.answers["/v1/rank"] = (200, {"cache": "miss", "truncated": False}, {headers.INSTANCE: "i0"})
        target = HTTPTarget(url, workload)

        def three() -> None:
            for req in workload.requests[:3]:
                target.rank(req)

        threads = [threading.Thread(target=three) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        target.close()
    ports = [s["port"] for s in stub.seen]
    assert len(ports) == 6 and len(set(ports)) == 2  # each thread kept its own connection alive


def test_a_connection_the_server_closed_is_reopened_not_reused(workload):
    with stub_server() as (stub, url):
        stub.answers["/v1/rank"] = (200, {"cache": "miss", "truncated": False}, {headers.INSTANCE: "i0"})
        stub.hang_up = True
        target = HTTPTarget(url, workload)
        for req in workload.requests[:3]:
            assert target.rank(req) == ("miss", False, 200)
            assert stub.hung_up.acquire(timeout=10)  # the server has closed this connection before the next rank
        target.close()
    ports = [s["port"] for s in stub.seen]
    assert len(ports) == 3 and len(set(ports)) == 3  # a fresh connection each time, and no failed rank


def test_a_base_url_that_is_not_plain_http_is_refused(workload):
    for url in ("https://127.0.0.1:8080", "127.0.0.1:8080"):
        with pytest.raises(ValueError, match="http://host:port"):
            HTTPTarget(url, workload)


def test_connection_error_raises_and_becomes_an_error_outcome(workload):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    target = HTTPTarget(f"http://127.0.0.1:{port}", workload, timeout_s=(1.0, 2.0))
    with pytest.raises(ConnectionRefusedError):
        target.rank(workload.requests[0])
    outcomes = run_open_loop(workload, target.preinfer, target.rank, max_workers=4)
    target.close()
    assert len(outcomes) == 2 * len(workload.requests)
    assert all(o.status == 599 and not o.ok and "ConnectionRefusedError" in o.error for o in outcomes)
    summary = summarize(outcomes, SPEC.qps)
    assert summary["errors"] == len(workload.requests) and summary["rejected_503"] == 0


# ---------------------------------------------------------------------- the real API on a FakeEngine
def bounded_input(app):
    """wsgi.input limited to Content-Length, as gunicorn provides it (werkzeug's development server
    hands over the raw socket, on which the API's end-of-request drain would block)."""

    def wrapped(environ, start_response):
        environ["wsgi.input"] = LimitedStream(environ["wsgi.input"], int(environ.get("CONTENT_LENGTH") or 0))
        return app(environ, start_response)

    return wrapped


@contextlib.contextmanager
def live_app(engine: FakeEngine) -> Iterator[str]:
    settings = resolve_settings(engine.config, instance_id=engine.instance_id)
    app = create_app(engine.config, engine=engine, settings=settings)
    server = make_server("127.0.0.1", 0, bounded_input(app), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(5)


def test_open_loop_through_the_api_relay_engine(workload):
    engine = FakeEngine(load_config(CONFIGS / "tiny.yaml"), instance_id="t0")
    with live_app(engine) as url:
        target = HTTPTarget(url, workload, timeout_s=(2.0, 10.0))
        target.prepare(workload.requests)
        # The gaps are 2 ms on average: make every rank follow its pre-infer's answer (the fake
        # admits synchronously), so the tiers are exact.
        for req in workload.requests:
            assert target.preinfer(req)[2] == 202
            assert target.rank(req) == ("device", False, 200)
        outcomes = run_open_loop(workload, target.preinfer, target.rank, max_workers=4)
        target.close()
    summary = summarize(outcomes, SPEC.qps)
    assert summary["ranks"] == len(workload.requests) and summary["errors"] == 0
    assert set(summary["trigger"]) <= {"admitted", "already_cached"}
    assert target.instance_counts() == {"preinfer": {"t0": 2 * len(workload.requests)},
                                        "rank": {"t0": 2 * len(workload.requests)}}
    assert target.colocated_fraction() == 1.0
    assert [c for c in engine.calls if c[0] == "rank"][0] == ("rank", user_id(workload.requests[0].user))


def test_baseline_truncation_overload_and_bad_requests_through_the_api(workload):
    config = load_config(CONFIGS / "tiny.yaml", ["relay.enabled=false", "relay.max_online_len=12"])
    engine = FakeEngine(config, instance_id="b0")
    req = workload.requests[0]
    assert len(workload.history(req)["item_ids"]) > 12
    with live_app(engine) as url:
        target = HTTPTarget(url, workload, timeout_s=(2.0, 10.0))
        assert target.preinfer(req) == ("disabled", False, 202)
        assert target.rank(req) == ("bypass", True, 200)
        engine.overloaded = True
        assert target.rank(req) == ("http_503", False, 503)
        outcomes = run_open_loop(workload, None, target.rank, max_workers=4)
        engine.overloaded = False
        # Items outside the model's vocabulary: a 400 the loader counts as an error.
        too_big = Workload.generate(replace(SPEC, num_items=10_000))
        bad = HTTPTarget(url, too_big, timeout_s=(2.0, 10.0))
        statuses = {bad.rank(r)[2] for r in too_big.requests}
        target.close()
        bad.close()
    summary = summarize(outcomes, SPEC.qps)
    assert summary["rejected_503"] == len(workload.requests) and summary["errors"] == 0
    assert statuses == {400}
