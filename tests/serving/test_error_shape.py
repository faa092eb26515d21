"""One error shape (issue #22 item 5): every error a client can get, from an instance's gunicorn or
from nginx in front of it, is JSON `{"error": "...", "field": ...}`; nginx passes the instances'
own errors (and the Retry-After of their 503s) through untouched."""

from __future__ import annotations

import json
import socket

import pytest
from gunicorn.http.errors import (
    InvalidHeader,
    InvalidRequestLine,
    InvalidResponseHeader,
    LimitRequestHeaders,
    LimitRequestLine,
    UnsupportedTransferCoding,
)

from serving import headers
from serving.worker import client_error_status, error_body, error_response
from tests.serving.conftest import rank_body
from tests.serving.servers import FAKE_FACTORY, HOST, cluster, serve, tail

READ_TIMEOUT_S = 30.0  # a generous failure condition, never a latency threshold


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes] | None:
    """One HTTP/1.1 response, read by its Content-Length; None if the server closed without one."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            assert not buf, f"connection closed inside a response head: {buf[:300]!r}"
            return None
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    while len(body) < int(fields["content-length"]):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(status_line.split()[1]), fields, body


def exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes on a new connection to 127.0.0.1:`port`; returns the response."""
    with socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(data)
        response = read_response(sock)
    assert response is not None, f"no response to {data[:80]!r}"
    return response


def assert_json_error(response: tuple[int, dict[str, str], bytes], status: int, field: str | None = None) -> dict:
    """The response is `status` with the API's JSON error body (naming `field`); returns the body."""
    got, fields, body = response
    assert got == status, (got, body[:300])
    assert fields["content-type"].startswith("application/json"), (status, fields, body[:300])
    doc = json.loads(body)
    assert set(doc) == {"error", "field"} and isinstance(doc["error"], str) and doc["error"], doc
    assert doc["field"] == field, doc
    return doc


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# Requests only a server's HTTP parser sees (none reaches the app), with the status they get.
GUNICORN_LEVEL = [
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, None),
    (b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, None),
    (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length"),
    (b"GARBAGE\r\n\r\n", 400, None),
    (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "Transfer-Encoding"),
]


def test_gunicorn_errors_map_to_its_status_codes_and_the_json_shape():
    assert client_error_status(LimitRequestLine(5000, 4094)) == 414
    assert client_error_status(LimitRequestHeaders("limit request headers fields size")) == 431
    assert client_error_status(UnsupportedTransferCoding("gzip")) == 501
    assert client_error_status(InvalidRequestLine("GARBAGE")) == 400
    assert client_error_status(InvalidResponseHeader("X-Bad")) is None  # the app's header: a 500
    assert client_error_status(RuntimeError("bug")) is None
    assert error_body(400, InvalidHeader("CONTENT-LENGTH", req=object())) == (
        "Invalid HTTP Header: 'CONTENT-LENGTH'", "Content-Length")
    assert error_body(400, InvalidHeader("bare LF as line terminator"))[1] is None  # no header named
    assert error_body(500, RuntimeError("secret detail")) == ("internal error (RuntimeError)", None)
    head, _, body = error_response(431, "request header fields are too large", None).partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 431 Request Header Fields Too Large"
    assert b"Content-Type: application/json" in head and b"Connection: close" in head
    assert b"Content-Length: %d" % len(body) in head
    assert json.loads(body) == {"error": "request header fields are too large", "field": None}


@pytest.mark.slow
def test_an_instance_answers_every_error_in_json(tmp_path):
    with serve(tmp_path, "e0", engine_factory=FAKE_FACTORY) as (url, proc, log):
        port = port_of(url)
        for data, status, field in GUNICORN_LEVEL:
            assert_json_error(exchange(port, data), status, field)
        chunked = b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
        response = exchange(port, chunked)  # read by the app: a malformed chunk was a logged 500
        assert "malformed request body" in assert_json_error(response, 400)["error"]
        assert response[1]["connection"] == "close"
        allowed = exchange(port, b"PUT /v1/rank HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert_json_error(allowed, 405)
        assert "POST" in allowed[1]["allow"]
        assert_json_error(exchange(port, b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"), 404)
        text = log.read_text()
        assert "Traceback" not in text and "[ERROR]" not in text, tail(log)


@pytest.mark.slow
def test_nginx_answers_its_own_errors_in_json_and_passes_the_instances_on(tmp_path):
    env = {"RELAYGR_FAKE_OVERLOADED": "i0"}
    with cluster(tmp_path, 1, engine_factory=FAKE_FACTORY, env=env) as (url, proc, run_dir, port):
        nginx_level = [
            (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, None),
            (b"GET /readyz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 431, None),  # nginx's 494
            (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, None),
            (b"GARBAGE\r\n\r\n", 400, None),
            (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"),
            (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, None),
            (b"TRACE / HTTP/1.1\r\nHost: x\r\n\r\n", 405, None),
            (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505, None),
            (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n", 413, "body"),
            (b"GET /_relaygr_error HTTP/1.1\r\nHost: x\r\n\r\n", 404, None),  # the error page is internal
        ]
        for data, status, field in nginx_level:
            response = exchange(port, data)
            assert_json_error(response, status, field)
            assert headers.INSTANCE.lower() not in response[1], data[:60]  # nginx answered

        # Past nginx's 8 KiB line buffer but not gunicorn's 4 KiB limit: the instance's JSON 414.
        response = exchange(port, b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert_json_error(response, 414)
        # The app's errors pass through with their headers: a 405 with Allow, a 503 with Retry-After.
        allowed = exchange(port, b"PUT /v1/rank HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert_json_error(allowed, 405)
        assert "POST" in allowed[1]["allow"] and allowed[1][headers.INSTANCE.lower()] == "i0"
        body = json.dumps(rank_body()).encode()
        overloaded = exchange(port, b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert_json_error(overloaded, 503)
        assert overloaded[1][headers.RETRY_AFTER.lower()] == "1" and overloaded[1][headers.INSTANCE.lower()] == "i0"
