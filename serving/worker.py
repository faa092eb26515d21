"""The gunicorn worker of a RelayGR instance: gthread, hardened against slow and stalled clients.

gunicorn's gthread worker reads a request with blocking socket reads that never time out, in a pool
thread, and closes connections on its main loop, where a graceful close waits up to 2 s for the
client's FIN. So a few clients that send part of a request and stall hold every thread, and clients
that never close stall the loop that accepts and dispatches everyone else. This worker:

* bounds every read of a request: each waits at most `serving.client_timeout_s` (a client silent
  that long), and all of them end by `serving.request_timeout_s` after the thread took the request
  (headers and body together: a client sending a byte now and then never trips the first). A client
  cut off while its headers are read is disconnected; while the app reads its body, the request ends
  with a JSON 408 and the connection closes. Either way its thread is free again;
* closes connections in the pool thread that served them, never on the main loop;
* answers gunicorn's own errors (request line or headers too large, malformed headers, a malformed
  chunked body) in the API's JSON shape `{"error": ..., "field": ...}`, with gunicorn's status codes;
* refuses what nginx refuses in front of a cluster (serving/framing.py): a transfer coding other than
  chunked (501), a chunk size no body can have (400), chunks announcing more than
  `serving.max_content_length` (413), before the app waits for their bytes;
* drains on SIGTERM: for `serving.drain_s` it keeps serving while /readyz answers 503 (`on_drain`) and
  every answer closes its connection; then it stops accepting without resetting a connection that
  already connected (serving/drain.py), closes its idle connections, finishes what it accepted and exits
  (gthread alone reset the connections in its accept queue, and waited for idle connections until the
  graceful timeout).

Written against gunicorn 27.0.1 (gunicorn/workers/gthread.py and gunicorn/workers/base.py).
"""

from __future__ import annotations

import errno
import json
import math
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import datetime
from http import HTTPStatus
from ssl import SSLError
from typing import Any

from gunicorn import util
from gunicorn.http.body import Body
from gunicorn.http.errors import (
    ChunkMissingTerminator,
    ConfigurationProblem,
    ExpectationFailed,
    ForbiddenProxyRequest,
    InvalidChunkExtension,
    InvalidChunkSize,
    InvalidH2CPreface,
    InvalidHeader,
    InvalidHeaderName,
    InvalidHTTPVersion,
    InvalidProxyLine,
    InvalidRequestLine,
    InvalidRequestMethod,
    InvalidResponseHeader,
    InvalidResponseHeaderName,
    InvalidSchemeHeaders,
    LimitRequestHeaders,
    LimitRequestLine,
    NoMoreData,
    ObsoleteFolding,
    ParseException,
    UnsupportedTransferCoding,
)
from gunicorn.http.message import Request
from gunicorn.http.unreader import SocketUnreader
from gunicorn.http.wsgi import Response, default_environ
from gunicorn.workers.gthread import TConn, ThreadWorker
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, RequestTimeout

from mindspore_relaygr.config import ServingConfig
from serving import drain
from serving.framing import ChunkedBodyTooLarge, bound_chunks, check_transfer_coding

# The client errors of gunicorn's Worker.handle_error, with its status codes; anything else is a 500.
CLIENT_ERRORS: tuple[tuple[tuple[type[BaseException], ...], int], ...] = (
    ((LimitRequestLine,), 414),
    ((LimitRequestHeaders,), 431),
    ((UnsupportedTransferCoding,), 501),
    ((ExpectationFailed,), 417),
    ((ForbiddenProxyRequest, SSLError), 403),
    ((ConfigurationProblem,), 500),
    ((InvalidRequestLine, InvalidRequestMethod, InvalidHTTPVersion, InvalidHeader, InvalidHeaderName,
      InvalidProxyLine, InvalidSchemeHeaders, ObsoleteFolding, InvalidH2CPreface, InvalidChunkSize,
      ChunkMissingTerminator, InvalidChunkExtension), 400),
)
MESSAGES = {414: "request line is too long", 431: "request header fields are too large"}


class ClientTimeout(NoMoreData, TimeoutError):
    """The client sent nothing for client_timeout_s in the middle of a request (`whole` False), or did not
    send the whole request within request_timeout_s (`whole` True).

    gthread's handle() takes a NoMoreData for a client that went away (closed without a log line);
    its body drain takes a TimeoutError as a drain to abandon (the connection closes)."""

    def __init__(self, whole: bool = False) -> None:
        super().__init__()
        self.whole = whole

    def __str__(self) -> str:
        if self.whole:
            return "the client did not send the whole request within the request deadline"
        return "the client sent nothing within the read timeout"


class ReadLimits:
    """The read limits of one connection: each read waits at most `idle_s`, and the reads of one request end
    by its deadline, `request_s` after `start_request`."""

    def __init__(self, idle_s: float, request_s: float, clock: Any = time.monotonic) -> None:
        self.idle_s, self.request_s, self._clock = idle_s, request_s, clock
        self.deadline = math.inf

    def start_request(self) -> None:
        self.deadline = self._clock() + self.request_s

    def next_wait(self) -> tuple[float, bool]:
        """(seconds the next read may wait, whether the request deadline is what limits it)."""
        left = self.deadline - self._clock()
        return (self.idle_s, False) if left > self.idle_s else (max(left, 0.0), True)


class TimedUnreader(SocketUnreader):
    """Socket reads that raise ClientTimeout when the read waited `limits` allow runs out."""

    timed_out = False

    def __init__(self, sock: socket.socket, limits: ReadLimits) -> None:
        super().__init__(sock)
        self.limits = limits

    def chunk(self, size_hint: int | None = None) -> bytes:
        wait, whole = self.limits.next_wait()
        if wait <= 0:
            self.timed_out = True
            raise ClientTimeout(whole=True)
        self.sock.settimeout(wait)
        try:
            return super().chunk(size_hint)
        except TimeoutError as exc:  # socket.timeout
            self.timed_out = True
            raise ClientTimeout(whole) from exc


class TimedConn(TConn):
    """A gthread connection whose reads are bounded by `limits` (ReadLimits)."""

    def __init__(self, cfg: Any, sock: socket.socket, client: Any, server: Any, limits: ReadLimits) -> None:
        super().__init__(cfg, sock, client, server)
        self.limits = limits

    def init(self) -> None:
        """TConn.init(), then the timeout: init() and handle() call setblocking(True), which clears it."""
        first = not self.initialized
        super().init()
        if first and not self.is_http2:
            unreader = TimedUnreader(self.sock, self.limits)
            unreader.unread(self.parser.unreader.take_buffered())
            self.parser.unreader = unreader
        self.sock.settimeout(self.limits.idle_s)

    def wait_for_data(self, timeout: float) -> bool:
        """A new connection waits for its first byte in a pool thread: within the read limits."""
        return super().wait_for_data(min(timeout, self.limits.next_wait()[0]))

    @property
    def timed_out(self) -> bool:
        """Whether a read of this connection timed out (it is then closed without lingering)."""
        return self.parser is not None and getattr(self.parser.unreader, "timed_out", False)

    def close(self, graceful: bool = False) -> None:
        if self.sock.fileno() != -1:  # the pool thread that served it may have closed it already
            super().close(graceful)


class AppInput:
    """The app's wsgi.input: gunicorn's request body, whose read errors become the app's JSON answers
    (408 for a client that stalled, 400 for a malformed chunked body). The request then closes its
    connection, and later reads return b"" so the app's own drain ends at once.

    They are raised as werkzeug HTTP errors, which werkzeug's input stream lets through (it turns an
    OSError or ValueError into "client disconnected") and the app's error handler answers in JSON."""

    def __init__(self, body: Body, req: Request, limits: ReadLimits) -> None:
        self._body, self._req, self._limits = body, req, limits
        self._failed = False

    def read(self, size: int | None = None) -> bytes:
        return self._guard(self._body.read, size)

    def readline(self, size: int | None = None) -> bytes:
        return self._guard(self._body.readline, size)

    def readlines(self, hint: int | None = None) -> list[bytes]:
        return list(self)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")

    def _guard(self, read: Callable[[int | None], bytes], size: int | None) -> bytes:
        if self._failed:
            return b""
        try:
            return read(size)
        except ClientTimeout as exc:
            self._fail()
            if exc.whole:
                raise RequestTimeout(f"the request was not received within {self._limits.request_s:g} s "
                                     f"(serving.request_timeout_s)") from exc
            raise RequestTimeout(f"the request body stalled for {self._limits.idle_s:g} s "
                                 f"(serving.client_timeout_s)") from exc
        except ChunkedBodyTooLarge as exc:
            self._fail()
            raise RequestEntityTooLarge(str(exc)) from exc
        except ParseException as exc:
            self._fail()
            raise BadRequest(f"malformed request body ({exc})") from exc

    def _fail(self) -> None:
        self._failed = True
        self._req.force_close()  # "Connection: close": where the next request would start is unknown


class RelayGRWorker(ThreadWorker):
    """gthread with client read limits, closes off the main loop and JSON errors."""

    # the instance's own: set by gunicorn.conf.py's post_fork
    client_timeout_s = ServingConfig.client_timeout_s
    request_timeout_s = ServingConfig.request_timeout_s
    max_content_length = ServingConfig.max_content_length
    drain_s = ServingConfig.drain_s
    on_drain: Callable[[], None] = staticmethod(lambda: None)  # makes /readyz fail

    _drain_started: float | None = None  # when SIGTERM came
    _close_at: float | None = None  # when the listening sockets close (new connections are refused by then)

    def accept(self, listener: socket.socket) -> None:
        """ThreadWorker.accept with a TimedConn."""
        try:
            client_sock, client_addr = listener.accept()
            self._adopt(client_sock, client_addr, listener.getsockname())
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise

    def _adopt(self, client_sock: socket.socket, client_addr: Any, server_addr: Any) -> None:
        self.nr_conns += 1
        client_sock.setblocking(True)
        limits = ReadLimits(self.client_timeout_s, self.request_timeout_s)
        self.enqueue_req(TimedConn(self.cfg, client_sock, client_addr, server_addr, limits))

    # ------------------------------------------------------------------ drain on SIGTERM
    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM: start draining (gthread would stop accepting at once and reset its accept queue)."""
        if self.alive and self._drain_started is None:
            self._drain_started = time.monotonic()
            self.on_drain()
            self.method_queue.defer(lambda: None)  # wake the main loop

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """The main loop's wait, cut short by the steps of a drain; the last step ends the loop (alive=False),
        and gthread's graceful shutdown then finishes the connections accepted."""
        if self.alive and self._drain_started is not None:
            timeout = min(timeout, self._drain_step())
            if not self.alive:
                return
        super().wait_for_and_dispatch_events(timeout)

    def _drain_step(self) -> float:
        """Take the drain's next step if it is due; returns the seconds until the one after."""
        now = time.monotonic()
        if self._close_at is None:
            left = self._drain_started + self.drain_s - now
            if left > 0:
                return left
            self._close_at = now + self._refuse_new_connections()
        left = self._close_at - now
        if left > 0:
            return left
        taken = self._stop_accepting()
        self._close_idle()
        self.log.info("draining: stopped accepting %.1f s after SIGTERM (%d queued connections taken); finishing "
                      "%d connections", now - self._drain_started, taken, self.nr_conns)
        self.alive = False
        return 0.0

    def _refuse_new_connections(self) -> float:
        """Drop new connection attempts where the master has let go of the listening socket; returns the grace
        for handshakes under way (0 when nothing was filtered)."""
        filtered = False
        for listener in self.sockets:
            if drain.master_holds_socket(listener, self.ppid) is False:
                filtered = drain.refuse_new_connections(listener) or filtered
        return drain.HANDSHAKE_GRACE_S if filtered else 0.0

    def _stop_accepting(self) -> int:
        """Serve every connection still queued on the listening sockets, then close them; returns how many."""
        self.set_accept_enabled(False)
        taken = 0
        for listener in self.sockets:
            server_addr = listener.getsockname()
            for client_sock, client_addr in drain.accept_backlog(listener):
                self._adopt(client_sock, client_addr, server_addr)
                taken += 1
            listener.close()
        return taken

    def _close_idle(self) -> None:
        """Close kept-alive connections (idle through the whole drain) and connections that never sent a byte."""
        self.murder_keepalived(force=True)
        while self.pending_conns:
            conn = self.pending_conns.popleft()
            with suppress(OSError, KeyError, ValueError):
                self.poller.unregister(conn.sock)
            self.nr_conns -= 1
            conn.close()

    def handle(self, conn: TimedConn) -> Any:
        """ThreadWorker.handle, then close a finished connection in this thread: on the main loop, a
        client that never sends its FIN would hold up every other client for 2 s."""
        conn.limits.start_request()  # one request per call: a kept-alive connection's next one starts afresh
        result = super().handle(conn)
        if result is False:
            conn.close(graceful=not conn.timed_out)  # a client that stalled gets no linger
        return result

    def handle_request(self, req: Request, conn: TimedConn) -> bool:
        """ThreadWorker.handle_request with the body as AppInput while the app runs."""
        check_transfer_coding(req)  # raised here, it is answered by handle_error and the connection closes
        bound_chunks(req, self.max_content_length)
        if self._drain_started is not None:
            req.force_close()  # draining: "Connection: close", the client's next request goes elsewhere
        body = req.body
        req.body = AppInput(body, req, conn.limits)
        try:
            return super().handle_request(req, conn)
        finally:
            req.body = body  # gunicorn's own drain of an unread body reads the socket as before

    def handle_error(self, req: Request | None, client: socket.socket, addr: Any, exc: BaseException) -> None:
        """Worker.handle_error (same status codes, log lines and access log), answering in JSON."""
        start = datetime.now()
        addr = addr or ("", -1)  # unix socket
        status = client_error_status(exc)
        if status is not None:
            self.log.warning("Invalid request from ip=%s: %s", addr[0], exc)
            if req is None and isinstance(getattr(exc, "req", None), Request):
                req = exc.req  # a header error of a parsed request: for the access log
        else:
            self.log.exception("Error handling request %s", getattr(req, "uri", "(no URI read)"))
            status = 500
        payload = error_response(status, *error_body(status, exc))
        if req is not None:
            environ = default_environ(req, client, self.cfg)
            environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = addr[0], str(addr[1])
            resp = Response(req, client, self.cfg)
            resp.status = f"{status} {HTTPStatus(status).phrase}"
            resp.response_length = len(payload)
            self.log.access(resp, req, environ, datetime.now() - start)
        try:
            util.write_nonblock(client, payload)
        except Exception:  # noqa: BLE001 - the client may be gone; nothing left to tell it
            self.log.debug("Failed to send error message.")


def client_error_status(exc: BaseException) -> int | None:
    """gunicorn's status code for a request it rejected; None for anything else (an error of ours)."""
    if isinstance(exc, InvalidResponseHeader | InvalidResponseHeaderName):
        return None  # a header the app tried to send
    return next((status for classes, status in CLIENT_ERRORS if isinstance(exc, classes)), None)


def error_body(status: int, exc: BaseException) -> tuple[str, str | None]:
    """(error, field) of the JSON answer; a rejected header value names its header, as the app's errors do."""
    if status == 500:
        return f"internal error ({type(exc).__name__})", None
    named = isinstance(exc, InvalidHeader) and exc.req is not None  # then hdr is the header's name, upper case
    field = str(exc.hdr).title() if named else "Transfer-Encoding" if isinstance(exc, UnsupportedTransferCoding) \
        else None
    return MESSAGES.get(status) or str(exc)[:200], field


def error_response(status: int, message: str, field: str | None) -> bytes:
    """A complete HTTP/1.1 response carrying `{"error": message, "field": field}`; the connection closes."""
    body = json.dumps({"error": message, "field": field}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body
