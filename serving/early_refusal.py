"""Refuse a rank before Flask sees it, when admission control's queue alone refuses it.

Clients that resend a refused rank at once (a wrk-like retry loop, a client ignoring Retry-After)
turn each refusal into another request, so a refusal must cost the instance as little as possible.
Where `AdmissionControl.refuse_early` decides from the headers alone (the work ahead alone is over
the budget, or the affinity key's last refused size still does not fit), this WSGI middleware
answers the same JSON 503 + Retry-After the app would, without Flask's request context, routing,
error handler or JSON provider (about half of a refusal's CPU time, measured), and without parsing
the body, which it drains so the kept-alive connection stays usable. It counts the request in the
same metrics as the app. Every other request goes to the app unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from serving import api, headers
from serving.state import AppState

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
RANK_PATH = "/v1/rank"
_AFFINITY_ENV = "HTTP_" + headers.AFFINITY.upper().replace("-", "_")
_ROUTED_ENV = "HTTP_" + headers.ROUTED.upper().replace("-", "_")


class EarlyRefusal:
    """WSGI middleware in front of the Flask app (`app.wsgi_app`)."""

    def __init__(self, app: WSGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        st = self.state
        if st.admission is None or environ.get("REQUEST_METHOD") != "POST" or environ.get("PATH_INFO") != RANK_PATH:
            return self.app(environ, start_response)
        t0, cpu0 = time.perf_counter(), api.cpu_clock()
        key = environ.get(_AFFINITY_ENV) or None
        if not st.admission.refuse_early(key, api.last_try(st, key, environ.get(_ROUTED_ENV))):
            return self.app(environ, start_response)
        body = json.dumps({"error": api.overloaded_message(st), "field": None}).encode()
        api.drain_body(environ.get("wsgi.input"), _content_length(environ), 4 * st.settings.max_content_length)
        start_response("503 SERVICE UNAVAILABLE", [
            ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
            (headers.RETRY_AFTER, str(st.settings.retry_after_s)), (headers.INSTANCE, st.instance_id)])
        st.metrics.observe_request(RANK_PATH, "POST", 503, time.perf_counter() - t0, None)
        st.metrics.observe_rejection(RANK_PATH, "overloaded")
        st.admission.spent_elsewhere((api.cpu_clock() - cpu0) * 1e3)
        return [body]


def _content_length(environ: dict[str, Any]) -> int | None:
    try:
        return int(environ["CONTENT_LENGTH"])
    except (KeyError, ValueError):
        return None
