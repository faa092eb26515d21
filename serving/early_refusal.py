"""Refuse a rank before Flask sees it, when admission control's queue alone refuses it.

Clients that resend a refused rank at once (a wrk-like retry loop, a client ignoring Retry-After)
turn each refusal into another request, so a refusal must cost the instance as little as possible.
Where `AdmissionControl.refuse_early` decides from the headers alone (the work ahead alone is over
the budget, or the affinity key's last refused size still does not fit), this WSGI middleware
answers the same JSON 503 + Retry-After the app would, without Flask's request context, routing,
error handler or JSON provider (about half of a refusal's CPU time, measured), and without parsing
the body, which it drains so the kept-alive connection stays usable. It counts the request in the
same metrics as the app. Every other request goes to the app unchanged.

Clients that resend at once still keep the instance busy with refusals: 64 such connections took
~1,900 refusals per second of its CPU and left ranks 40-75 per second of its ~300. So the answers to
resent ranks (a key refused before and not admitted since) are paced to
`serving.resent_refusals_per_s`: below that rate none waits; above it each waits its turn asleep
(no CPU, no interpreter lock, but a server thread), at most `serving.retry_after_s`, what the client
was asked to wait anyway. A key's first refusal (nginx's first try, a user's first rank) is never paced.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from mindspore_relaygr.config import ServingConfig
from mindspore_relaygr.relay.admission import RESENT
from serving import api, headers
from serving.state import AppState

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
RANK_PATH = "/v1/rank"
_AFFINITY_ENV = "HTTP_" + headers.AFFINITY.upper().replace("-", "_")
_ROUTED_ENV = "HTTP_" + headers.ROUTED.upper().replace("-", "_")


class RefusalPacer:
    """Spaces refusals at least 1 / `rate_per_s` apart, each reserving the next free slot; a refusal whose
    slot is more than `max_delay_s` away waits `max_delay_s` and reserves none."""

    def __init__(self, rate_per_s: float, max_delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = 1.0 / rate_per_s
        self.max_delay_s = max_delay_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0.0  # the next free slot

    def delay_s(self) -> float:
        """How long this refusal waits before it is answered."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            if slot - now > self.max_delay_s:
                return self.max_delay_s
            self._next = slot + self.interval_s
            return slot - now


class EarlyRefusal:
    """WSGI middleware in front of the Flask app (`app.wsgi_app`)."""

    def __init__(self, app: WSGIApp, state: AppState, pacer: RefusalPacer | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.app = app
        self.state = state
        self.pacer = pacer
        self.sleep = sleep

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        st = self.state
        if st.admission is None or environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != RANK_PATH:
            return self.app(environ, start_response)
        t0, cpu0 = time.perf_counter(), api.cpu_clock()
        key = environ.get(_AFFINITY_ENV) or None
        why = st.admission.refuse_early(key, api.last_try(st, key, environ.get(_ROUTED_ENV)))
        if why is None:
            return self.app(environ, start_response)
        if why == RESENT and self.pacer is not None:
            self.sleep(self.pacer.delay_s())
        body = json.dumps({"error": api.overloaded_message(st), "field": None}).encode()
        api.drain_body(environ.get("wsgi.input"), _content_length(environ), 4 * st.settings.max_content_length)
        start_response("503 SERVICE UNAVAILABLE", [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
            (headers.RETRY_AFTER, str(st.settings.retry_after_s)), (headers.INSTANCE, st.instance_id)])
        st.metrics.observe_request(RANK_PATH, "POST", 503, time.perf_counter() - t0, None)
        st.metrics.observe_rejection(RANK_PATH, "overloaded")
        st.admission.spent_elsewhere((api.cpu_clock() - cpu0) * 1e3)
        return [body]


def refusal_pacer(settings: ServingConfig) -> RefusalPacer | None:
    """The pacer of serving.resent_refusals_per_s (None: off)."""
    rate = settings.resent_refusals_per_s
    return None if rate is None or settings.retry_after_s == 0 else RefusalPacer(rate, settings.retry_after_s)


def _content_length(environ: dict[str, Any]) -> int | None:
    try:
        return int(environ["CONTENT_LENGTH"])
    except (KeyError, ValueError):
        return None
