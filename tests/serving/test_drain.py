"""SIGTERM drains an instance: /readyz fails first, what it accepted is answered, no request is reset, and the
master exits promptly.

Before, 10 requests that connected 18-60 ms after the signal were reset with no answer (the listening socket
closed with connections in its backlog), and a connection that had sent nothing kept the master up until its
15 s graceful timeout. The bounds below are generous liveness bounds, not timings.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from serving import drain, headers
from serving.app import create_app
from tests.serving.conftest import FakeEngine, rank_body
from tests.serving.servers import FAKE_FACTORY, HOST, serve, session
from tests.serving.test_error_shape import port_of, read_response
from tests.waiting import wait_until

EXIT_BOUND_S = 10.0  # graceful_timeout_s is 15: a master that waits for it fails this
FIRING_THREADS = 4


@dataclass
class Outcome:
    connected_at: float
    kind: str  # answered | not_connected | no_answer
    status: int | None = None
    detail: str = ""


def fire_until(port: int, stop: threading.Event, outcomes: list[Outcome], lock: threading.Lock) -> None:
    """Ranks on new connections, one after another, until `stop`; every attempt's outcome is recorded."""
    body = json.dumps(rank_body("drained-user")).encode()
    request = (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    while not stop.is_set():
        try:
            sock = socket.create_connection((HOST, port), timeout=3)
        except OSError as exc:  # refused, or no answer to the SYN: this request never connected
            outcome = Outcome(time.monotonic(), "not_connected", detail=repr(exc))
        else:
            connected_at = time.monotonic()
            with sock:
                sock.settimeout(30)
                try:
                    sock.sendall(request)
                    response = read_response(sock)
                except (OSError, AssertionError) as exc:  # reset, or closed inside the answer
                    outcome = Outcome(connected_at, "no_answer", detail=repr(exc))
                else:
                    if response is None:
                        outcome = Outcome(connected_at, "no_answer", detail="closed without an answer")
                    else:
                        outcome = Outcome(connected_at, "answered", response[0], json.dumps(response[1]))
                        if response[0] == 503:
                            assert json.loads(response[2])["error"] and response[1][headers.RETRY_AFTER.lower()]
        with lock:
            outcomes.append(outcome)


def readiness_until(url: str, stop: threading.Event, seen: list[tuple[float, int, str]]) -> None:
    while not stop.is_set():
        try:
            resp = session().get(f"{url}/readyz", timeout=(3, 30))
            seen.append((time.monotonic(), resp.status_code, resp.json().get("status", "")))
        except OSError:
            seen.append((time.monotonic(), 0, "unreachable"))


@pytest.mark.slow
def test_sigterm_answers_every_connected_request_and_exits_promptly(tmp_path):
    overrides = ("serving.client_timeout_s=1", "serving.drain_s=1")
    with serve(tmp_path, "dr0", engine_factory=FAKE_FACTORY, overrides=overrides) as (url, proc, log):
        port = port_of(url)
        idle = socket.create_connection((HOST, port))  # connected, sends nothing: handed to the poller after 1 s
        kept = session()
        assert kept.get(f"{url}/healthz", timeout=(3, 30)).status_code == 200  # an idle kept-alive connection
        idle_since = time.monotonic()
        stop, lock = threading.Event(), threading.Lock()
        outcomes: list[Outcome] = []
        readiness: list[tuple[float, int, str]] = []
        threads = [threading.Thread(target=fire_until, args=(port, stop, outcomes, lock))
                   for _ in range(FIRING_THREADS)]
        threads.append(threading.Thread(target=readiness_until, args=(url, stop, readiness)))
        for t in threads:
            t.start()
        try:
            wait_until(lambda: sum(o.kind == "answered" for o in outcomes) >= 100 and time.monotonic() - idle_since > 3,
                       timeout_s=60, what="100 answers and an idle connection older than 3 s", poll_s=0.05)
            signalled_at = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)  # the master, as `kill $(cat PIDFILE)` does
            proc.wait(60)
            exit_s = time.monotonic() - signalled_at
        finally:
            stop.set()
            for t in threads:
                t.join(60)
            idle.close()
            kept.close()
        failed = [o for o in outcomes if o.kind == "no_answer"]
        assert not failed, f"{len(failed)} connected requests got no answer, e.g. " \
                           f"{[(round(o.connected_at - signalled_at, 3), o.detail) for o in failed[:5]]}"
        answered = [o for o in outcomes if o.kind == "answered"]
        assert {o.status for o in answered} <= {200, 503}
        assert any(o.connected_at > signalled_at for o in answered), "nothing was answered while draining"
        after = [(status, state) for at, status, state in readiness if at > signalled_at]
        assert (503, "draining") in after, after[:10]  # readiness failed before the instance stopped accepting
        assert exit_s < EXIT_BOUND_S, f"the master took {exit_s:.1f} s to exit"
        assert proc.returncode == 0


def test_a_draining_app_is_not_ready_but_still_serves(tiny_config):
    app = create_app(tiny_config, engine=FakeEngine(tiny_config, "d1"))
    client = app.test_client()
    app.extensions["relaygr"].holder.drain()
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json["status"] == "draining" and ready.headers[headers.RETRY_AFTER]
    assert client.get("/healthz").json["engine"] == "draining"
    assert client.post("/v1/rank", json=rank_body()).status_code == 200
    stats = client.get("/v1/stats").json
    assert stats["ready"] is False and stats["engine"] is not None
    assert "relaygr_engine_ready 0.0" in client.get("/metrics").get_data(as_text=True)


def test_a_filtered_listener_completes_no_new_connection_and_keeps_its_queue():
    with socket.create_server((HOST, 0)) as listener:
        port = listener.getsockname()[1]
        queued = socket.create_connection((HOST, port))  # in the accept queue before the filter
        assert drain.refuse_new_connections(listener)
        with pytest.raises(TimeoutError):  # its SYN is dropped: no connection, nothing to reset later
            socket.create_connection((HOST, port), timeout=0.5)
        listener.setblocking(False)
        taken = drain.accept_backlog(listener)
        assert len(taken) == 1 and drain.accept_backlog(listener) == []
        queued.sendall(b"ping")
        assert taken[0][0].recv(4) == b"ping"
        for sock, _ in taken:
            sock.close()
        queued.close()


def test_whether_the_master_still_holds_the_listening_socket():
    with socket.create_server((HOST, 0)) as listener:
        assert drain.master_holds_socket(listener, os.getpid()) is True
        with socket.create_server((HOST, 0)) as other:
            assert drain.master_holds_socket(other, os.getppid()) is False  # the parent never had it

