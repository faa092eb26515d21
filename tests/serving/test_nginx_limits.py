"""The cluster's nginx under 2,000 stalled connections: normal requests are still answered, a client over its
connection limit is refused at once (JSON 429), and stalled clients are dropped after --client-timeout.

nginx's defaults failed here: 1,024 worker connections ("1024 worker_connections are not enough" once 1,100
bodies stalled, and every request failed), 60 s header and body timeouts, no per-client limit. Every wait
below is a generous failure condition, never a latency threshold.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import time
from collections.abc import Iterator

import pytest

from serving import headers
from serving.cluster import ClusterSpec, render_nginx_conf
from tests.serving.conftest import preinfer_body, rank_body
from tests.serving.servers import FAKE_FACTORY, HOST, cluster
from tests.serving.test_error_shape import READ_TIMEOUT_S, assert_json_error, read_response

HEADER_STALLS = 1000  # inside the request headers (not counted by limit_conn: no request yet)
BODY_STALLS = 1000  # complete headers, part of a body: each counts against its client's limit
PER_CLIENT = BODY_STALLS  # --conns-per-client: 127.0.0.1 is at its limit once the body stalls are in
CLIENT_CONNS = 2500  # --client-conns: room for every stalled connection and the test's own requests
CLIENT_TIMEOUT_S = 3  # --client-timeout
OTHER_CLIENT = "127.0.0.2"  # another client address on the loopback network (its own limit_conn key)
FILES_NEEDED = HEADER_STALLS + BODY_STALLS + 500


@pytest.fixture
def enough_files() -> Iterator[None]:
    """Raise this process's soft open-file limit for the stalled sockets (nginx sets its own, from the conf)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILES_NEEDED:
        pytest.skip(f"the hard open-file limit {hard} is below the {FILES_NEEDED} this test needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FILES_NEEDED), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_nginx_limits_are_sized_from_the_spec(tmp_path):
    spec = ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path, max_conns=64, max_client_conns=5000,
                       conns_per_client=200, client_timeout_s=7)
    conf = render_nginx_conf(spec)
    assert spec.worker_connections >= 5000 + 3 * 64  # every client and every connection to an instance
    assert f"worker_connections {spec.worker_connections};" in conf
    assert f"worker_rlimit_nofile {spec.nofile_limit};" in conf and spec.nofile_limit > 2 * spec.worker_connections
    for line in ("client_header_timeout 7s;", "client_body_timeout 7s;", "limit_conn relaygr_clients 200;",
                 "limit_conn_status 429;", f"keepalive {3 * 64};"):
        assert line in conf, line


def stall(port: int, in_body: bool) -> socket.socket:
    sock = socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S)
    if in_body:
        sock.sendall(b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n"
                     b"X-RelayGR-Affinity: stalled\r\n\r\n" + b'{"user_id": "stalled", "history": {"item_ids": [1')
    else:
        sock.sendall(b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nX-Stall")
    return sock


def request_from(source: str, port: int, method: str, path: str, body: dict | None = None,
                 affinity: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection from `source`; returns the response."""
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
    if body is not None:
        head += "Content-Type: application/json\r\n"
    if affinity:
        head += f"{headers.AFFINITY}: {affinity}\r\n"
    with socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S, source_address=(source, 0)) as sock:
        sock.sendall(head.encode() + b"\r\n" + data)
        response = read_response(sock)
    assert response is not None, f"{method} {path}: closed without an answer"
    return response


def wait_all_closed(socks: list[socket.socket], timeout_s: float) -> int:
    """Read every socket until the server closes it (a 408 or nothing); returns how many are still open."""
    with selectors.DefaultSelector() as sel:  # epoll: select() stops at file descriptor 1024
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                try:
                    closed = not key.fileobj.recv(65536)
                except OSError:  # reset: closed too
                    closed = True
                if closed:
                    sel.unregister(key.fileobj)
        return len(sel.get_map())


@pytest.mark.slow
def test_two_thousand_stalled_connections_leave_the_cluster_serving(tmp_path, enough_files):
    flags = ("--client-conns", str(CLIENT_CONNS), "--conns-per-client", str(PER_CLIENT),
             "--client-timeout", str(CLIENT_TIMEOUT_S))
    with cluster(tmp_path, 1, engine_factory=FAKE_FACTORY, extra_args=flags) as (url, proc, run_dir, port):
        held: list[socket.socket] = []
        try:
            held += [stall(port, in_body=False) for _ in range(HEADER_STALLS)]
            held += [stall(port, in_body=True) for _ in range(BODY_STALLS)]
            # Whatever the stalled clients do, another client is served.
            assert request_from(OTHER_CLIENT, port, "GET", "/readyz")[0] == 200
            pre = request_from(OTHER_CLIENT, port, "POST", "/v1/preinfer", preinfer_body("patient"), "patient")
            assert pre[0] == 202, pre
            rank = request_from(OTHER_CLIENT, port, "POST", "/v1/rank", rank_body("patient"), "patient")
            assert rank[0] == 200 and json.loads(rank[2])["cache"] == "device", rank
            # The stalling client is at its limit: one more request from it is refused at once.
            refused = request_from(HOST, port, "POST", "/v1/rank", rank_body("greedy"), "greedy")
            assert_json_error(refused, 429)
            assert refused[1]["retry-after"] == "1"
            # nginx drops the stalled connections after --client-timeout, not after its 60 s defaults.
            assert not wait_all_closed(held, timeout_s=30), "stalled connections still open after 30 s"
            assert request_from(HOST, port, "GET", "/readyz")[0] == 200  # its limit is free again
        finally:
            for sock in held:
                sock.close()
        log = (run_dir / "logs" / "nginx-error.log").read_text()
        assert "worker_connections are not enough" not in log and "setrlimit" not in log, log[-2000:]
