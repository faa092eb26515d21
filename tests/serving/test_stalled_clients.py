"""Stalled and slow clients cannot starve an instance (issue #22 item 4).

On a single instance a stalled client holds a gthread thread only until serving.client_timeout_s
passes without a byte from it, and connections are closed off the main loop (serving/worker.py);
behind nginx, nginx buffers whole requests before an instance sees them. The live tests hold their
stalled connections open until they end; the failure condition is a generous socket timeout, never
a latency threshold.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from gunicorn.http.errors import InvalidChunkSize, NoMoreData
from werkzeug.exceptions import BadRequest, RequestTimeout

from mindspore_relaygr.config import ServingConfig
from serving import headers
from serving.worker import AppInput, ClientTimeout, ReadLimits, TimedUnreader
from tests.serving.conftest import preinfer_body, rank_body
from tests.serving.servers import FAKE_FACTORY, HOST, cluster, serve, session, tail
from tests.serving.test_error_shape import READ_TIMEOUT_S, assert_json_error, port_of, read_response

NUM_STALLED = 16
TIMEOUT = (2, READ_TIMEOUT_S)


def stalled_request(k: int) -> tuple[bytes, bool]:
    """(bytes sent, stalls in its body): even k stop inside the headers, odd k after complete headers
    and the first bytes of a JSON body, to /v1/preinfer or /v1/rank."""
    if k % 2 == 0:
        return b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Stall", False
    path = b"/v1/preinfer" if k % 4 == 1 else b"/v1/rank"
    return b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n" \
           b"X-RelayGR-Affinity: stalled-%d\r\n\r\n" \
           b'{"user_id": "stalled-%d", "history": {"item_ids": [1, 2' % (path, k, k), True


@contextmanager
def stalled_clients(port: int, n: int = NUM_STALLED) -> Iterator[list[tuple[socket.socket, bool]]]:
    """n connections that each send part of a request and then nothing; closed on exit."""
    held: list[tuple[socket.socket, bool]] = []
    try:
        for k in range(n):
            sock = socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S)
            data, in_body = stalled_request(k)
            sock.sendall(data)
            held.append((sock, in_body))
        yield held
    finally:
        for sock, _ in held:
            sock.close()


def assert_serving(url: str) -> None:
    """/readyz, a pre-infer and a rank of another client are answered."""
    s = session()
    affinity = {headers.AFFINITY: "patient-user"}
    assert s.get(f"{url}/readyz", timeout=TIMEOUT).status_code == 200
    pre = s.post(f"{url}/v1/preinfer", json=preinfer_body("patient-user"), headers=affinity, timeout=TIMEOUT)
    assert pre.status_code == 202, pre.text
    rank = s.post(f"{url}/v1/rank", json=rank_body("patient-user"), headers=affinity, timeout=TIMEOUT)
    assert rank.status_code == 200, rank.text


@pytest.mark.slow
def test_more_stalled_clients_than_threads_leave_an_instance_serving_at_the_default_settings(tmp_path):
    """Every one of the default serving.threads held by a stalled client, and 16 more waiting: the default
    timeouts, not spare threads, keep the instance answering."""
    stalled = ServingConfig().threads + NUM_STALLED
    with serve(tmp_path, "st0", engine_factory=FAKE_FACTORY) as (url, proc, log), \
            stalled_clients(port_of(url), stalled):
        assert_serving(url)


@pytest.mark.slow
def test_stalled_clients_are_cut_off_after_client_timeout_s(tmp_path):
    """Four threads and sixteen stalled clients: the read timeout, not spare threads, frees them."""
    overrides = ("serving.threads=4", "serving.client_timeout_s=1")
    with serve(tmp_path, "st1", engine_factory=FAKE_FACTORY, overrides=overrides) as (url, proc, log):
        with stalled_clients(port_of(url)) as held:
            assert_serving(url)
            for sock, in_body in held:
                response = read_response(sock)
                if in_body:  # the app answered 408 and closed the connection
                    assert_json_error(response, 408)
                    assert response[1]["connection"] == "close"
                    assert sock.recv(1) == b""
                else:  # inside the headers there is no request to answer yet: closed
                    assert response is None
        metrics = session().get(f"{url}/metrics", timeout=TIMEOUT).text
        for path in ("/v1/preinfer", "/v1/rank"):
            assert f'relaygr_http_requests_total{{endpoint="{path}",method="POST",status="408"}} 4.0' in metrics
        assert 'status="500"' not in metrics
        text = log.read_text()
        assert "Traceback" not in text and "[ERROR]" not in text, tail(log)


class DripFeeder(threading.Thread):
    """A client that sends one byte of a request every `every_s` seconds (never idle long enough for the read
    timeout) until the server answers or closes; `answer` is then the response (None: closed without one)."""

    def __init__(self, port: int, in_body: bool, every_s: float = 0.5, give_up_s: float = 60.0) -> None:
        super().__init__(daemon=True)
        head = b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        self.data = head + (b"Content-Length: 4000\r\n\r\n" + b" " * 4000 if in_body else b"X-Drip: " + b"a" * 4000)
        self.sock = socket.create_connection((HOST, port), timeout=READ_TIMEOUT_S)
        self.in_body, self.every_s, self.give_up_s = in_body, every_s, give_up_s
        self.ended = threading.Event()
        self.answer: tuple | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.give_up_s
        sent = self.data.index(b"\r\n\r\n") + 4 if self.in_body else len(b"POST /v1/rank HTTP/1.1\r\n")
        try:
            self.sock.sendall(self.data[:sent])
            while time.monotonic() < deadline:
                readable, _, _ = select.select([self.sock], [], [], self.every_s)  # the pace of the drip
                if readable:
                    self.answer = read_response(self.sock)
                    self.ended.set()
                    return
                self.sock.sendall(self.data[sent:sent + 1])
                sent += 1
        except OSError:  # reset or closed while sending: the server gave up on it
            self.ended.set()
        finally:
            self.sock.close()


@pytest.mark.slow
def test_drip_fed_clients_are_cut_off_by_the_request_deadline(tmp_path):
    """80 clients sending one byte every 3 s kept an instance from answering /readyz for 30 s: each byte reset the
    idle read timeout. Here 8 drip-fed clients hold all 4 threads; serving.request_timeout_s (headers and body
    together) frees them, so other clients are answered while the drip goes on."""
    overrides = ("serving.threads=4", "serving.client_timeout_s=2", "serving.request_timeout_s=3")
    with serve(tmp_path, "st3", engine_factory=FAKE_FACTORY, overrides=overrides) as (url, proc, log):
        feeders = [DripFeeder(port_of(url), in_body=k % 2 == 1) for k in range(8)]
        for feeder in feeders:
            feeder.start()
        assert_serving(url)
        for feeder in feeders:
            assert feeder.ended.wait(READ_TIMEOUT_S), "a drip-fed client was never cut off"
            if feeder.in_body:  # the app was reading its body: a JSON 408
                assert "request_timeout_s" in assert_json_error(feeder.answer, 408)["error"]
            else:  # inside the headers there is no request to answer yet: closed
                assert feeder.answer is None


@pytest.mark.slow
def test_clients_that_never_close_do_not_stall_the_instance(tmp_path):
    """gunicorn closed "Connection: close" answers on its main loop, waiting up to 2 s for each
    client's FIN: 24 clients that never close held up every other client for 48 s."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    with serve(tmp_path, "st2", engine_factory=FAKE_FACTORY) as (url, proc, log):
        held = [socket.create_connection((HOST, port_of(url)), timeout=READ_TIMEOUT_S) for _ in range(24)]
        try:
            for sock in held:
                sock.sendall(request)
            assert_serving(url)
        finally:
            for sock in held:
                sock.close()


@pytest.mark.slow
def test_stalled_clients_behind_nginx_never_reach_an_instance(tmp_path):
    """nginx reads a whole request before it passes it on. Sixteen stalled clients (eight inside their body)
    against an instance of four threads, with every timeout (the instance's and nginx's) longer than the test:
    had nginx passed the stalled bodies on, they would hold all four threads and the patient client's requests
    would wait behind them until its socket timeout."""
    overrides = ("serving.threads=4", "serving.client_timeout_s=600", "serving.request_timeout_s=600")
    with cluster(tmp_path, 1, overrides=overrides, engine_factory=FAKE_FACTORY,
                 extra_args=("--client-timeout", "600")) as (url, proc, run_dir, port), stalled_clients(port):
        assert_serving(url)


class FakeBody:
    """gunicorn's Body stand-in: returns `chunks`, then raises `error`."""

    def __init__(self, chunks: list[bytes], error: Exception) -> None:
        self.chunks, self.error = chunks, error

    def read(self, size: int | None = None) -> bytes:
        if self.chunks:
            return self.chunks.pop(0)
        raise self.error

    readline = read


class FakeRequest:
    must_close = False

    def force_close(self) -> None:
        self.must_close = True


@pytest.mark.parametrize(("error", "answer"), [(ClientTimeout(), RequestTimeout),
                                               (InvalidChunkSize(b"zz"), BadRequest)])
def test_a_failed_body_read_becomes_the_apps_answer_and_closes_the_connection(error, answer):
    req = FakeRequest()
    body = AppInput(FakeBody([b'{"a": ', b"1"], error), req, ReadLimits(5.0, 10.0))
    assert body.read() == b'{"a": ' and body.readline() == b"1"
    with pytest.raises(answer):
        body.read()
    assert req.must_close
    assert body.read() == b"" and body.readline() == b"" and body.readlines() == []  # the app's drain ends


def test_a_read_timeout_is_a_client_that_went_away_to_gunicorn():
    server, client = socket.socketpair()
    with server, client:
        unreader = TimedUnreader(server, ReadLimits(0.01, 60.0))
        unreader.limits.start_request()
        client.sendall(b"GET / HT")
        assert unreader.read() == b"GET / HT"
        with pytest.raises(ClientTimeout) as caught:
            unreader.read()
        assert isinstance(caught.value, NoMoreData) and isinstance(caught.value, TimeoutError)
        assert unreader.timed_out


def test_the_request_deadline_limits_reads_once_it_is_nearer_than_the_idle_timeout():
    now = [100.0]
    limits = ReadLimits(idle_s=2.0, request_s=3.0, clock=lambda: now[0])
    limits.start_request()
    assert limits.next_wait() == (2.0, False)
    now[0] += 1.5
    assert limits.next_wait() == (1.5, True)
    now[0] += 2.0
    assert limits.next_wait() == (0.0, True)
    limits.start_request()  # the next request on a kept-alive connection
    assert limits.next_wait() == (2.0, False)


def test_a_client_past_the_request_deadline_is_cut_off_although_it_keeps_sending():
    server, client = socket.socketpair()
    with server, client:
        now = [0.0]
        unreader = TimedUnreader(server, ReadLimits(5.0, 10.0, clock=lambda: now[0]))
        unreader.limits.start_request()
        client.sendall(b"GET / HT")
        assert unreader.read() == b"GET / HT"
        now[0] = 10.5  # bytes keep coming, but the whole request is late
        client.sendall(b"TP/1.1")
        with pytest.raises(ClientTimeout) as caught:
            unreader.read()
        assert caught.value.whole and unreader.timed_out

