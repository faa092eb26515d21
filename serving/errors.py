"""The one place where exceptions become HTTP answers: JSON `{"error": ..., "field": ...}`.

Caller mistakes are 4xx naming the field; an instance that cannot serve now (overloaded, warming
up, shutting down) answers 503 with Retry-After so nginx moves on to the next upstream; anything
else is a logged 500 that never takes the worker down.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from mindspore_relaygr.errors import InvalidRequest, Overloaded, RelayGRError
from mindspore_relaygr.relay.executor import ExecutorClosed
from serving import headers

logger = logging.getLogger(__name__)


class NotReady(RelayGRError):
    """The engine is still warming up (or failed to start, or is shutting down)."""


class Unauthorized(RelayGRError):
    """An admin endpoint was called without the configured bearer token."""


def _json_error(status: int, message: str, field: str | None = None) -> Response:
    response = jsonify({"error": message, "field": field})
    response.status_code = status
    return response


def handle_exception(exc: Exception, retry_after_s: int) -> Response:
    """Map any exception raised while handling a request to a JSON response.

    `g.relaygr_error` records the kind (invalid, unauthorized, overloaded, not_ready, ...) for metrics.
    """
    g.relaygr_error = _kind(exc)
    if isinstance(exc, InvalidRequest):
        return _json_error(400, exc.message, exc.field)
    if isinstance(exc, Unauthorized):
        response = _json_error(401, str(exc) or "missing or wrong bearer token", "Authorization")
        response.headers["WWW-Authenticate"] = 'Bearer realm="relaygr-admin"'
        return response
    if isinstance(exc, Overloaded | NotReady):
        response = _json_error(503, str(exc))
        response.headers[headers.RETRY_AFTER] = str(retry_after_s)
        return response
    if isinstance(exc, RequestEntityTooLarge):
        return _json_error(413, "request body is larger than the configured maximum", "body")
    if isinstance(exc, HTTPException):
        allow = dict(exc.get_headers()).get("Allow")
        if exc.code == 404:
            message = f"no such endpoint: {request.path[:100]}"
        elif exc.code == 405:
            message = f"method {request.method[:10]} not allowed on {request.path[:100]}; allowed: {allow}"
        else:
            message = exc.description or exc.name
        response = _json_error(exc.code or 500, message)
        if allow:
            response.headers["Allow"] = allow
        return response
    if isinstance(exc, ExecutorClosed):  # the engine is shutting down
        response = _json_error(503, "instance is shutting down")
        response.headers[headers.RETRY_AFTER] = str(retry_after_s)
        return response
    logger.exception("unhandled error while serving a request")
    return _json_error(500, f"internal error ({type(exc).__name__})")


def _kind(exc: Exception) -> str:
    for cls, kind in ((InvalidRequest, "invalid"), (Unauthorized, "unauthorized"), (Overloaded, "overloaded"),
                      (NotReady, "not_ready"), (ExecutorClosed, "not_ready"), (HTTPException, "http")):
        if isinstance(exc, cls):
            return kind
    return "internal"


def register_error_handler(app: Flask, retry_after_s: int) -> None:
    """Install `handle_exception` as the app's only error handler."""
    app.register_error_handler(Exception, lambda exc: handle_exception(exc, retry_after_s))
