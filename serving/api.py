"""The RelayGR HTTP API (one blueprint): pre-infer, rank, health, readiness, metrics, stats, admin."""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import MethodNotAllowed, RequestEntityTooLarge, RequestTimeout

from mindspore_relaygr.errors import InvalidRequest, Overloaded
from mindspore_relaygr.model.inputs import validate_candidates, validate_history
from serving import headers, schemas
from serving.engine_holder import FAILED, READY
from serving.errors import Unauthorized
from serving.state import AppState

bp = Blueprint("relaygr", __name__)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
cpu_clock: Callable[[], float] = time.thread_time  # CPU seconds of this thread (tests replace it)


def _state() -> AppState:
    return current_app.extensions["relaygr"]


def _raw_body() -> bytes:
    """The body's bytes; a chunked body longer than MAX_CONTENT_LENGTH is a 413, not a truncated 400."""
    data = request.get_data(cache=False)
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if limit and request.content_length is None and len(data) >= limit:
        stream = request.environ.get("wsgi.input")
        if stream is not None and stream.read(1):
            raise RequestEntityTooLarge()
    return data


@bp.post("/v1/preinfer")
def preinfer() -> tuple[Response, int]:
    """Retrieval-time signal: maybe relay this user's prefix (202; the prefill runs asynchronously)."""
    st = _state()
    affinity = request.headers.get(headers.AFFINITY)
    if not affinity:  # nginx would hash the empty key: its rank would likely land elsewhere, an orphan prefill
        raise InvalidRequest(headers.AFFINITY, "is missing: send the percent-encoded user id in it, so that the "
                                               "pre-infer and its rank reach the same instance")
    data = _raw_body()
    with _parsing_slot(st, refuse=False):  # a refused pre-infer would be retried away from its rank's instance
        req = schemas.parse_preinfer(schemas.parse_json(data), st.limits, affinity)
    result = st.holder.get().preinfer(req.user_id, req.history, req.num_candidates)
    st.metrics.observe_preinfer(result)
    return jsonify({
        "admitted": result.admitted,
        "reason": result.reason,
        "cache_key": result.cache_key,
        "predicted_full_ms": result.predicted_full_ms,
        "instance": st.instance_id,
    }), 202


@bp.post("/v1/rank")
def rank() -> Response:
    """Ranking-time request: score every candidate, served from the best cache tier available."""
    t0 = time.perf_counter()
    st = _state()  # a rank the queue alone refuses was answered before Flask (serving.early_refusal)
    affinity = request.headers.get(headers.AFFINITY)
    data = _raw_body()  # a client stalling mid-body holds a thread (until serving.request_timeout_s), never budget
    with _parsing_slot(st, refuse=st.admission is not None):
        req = schemas.parse_rank(schemas.parse_json(data), st.limits, affinity)
        engine = st.holder.get()
        # Lists to arrays once: the prediction and the rank then re-check arrays, which costs next to nothing.
        history = validate_history(st.config.model, req.history)
        candidate_ids = validate_candidates(st.config.model, req.candidate_ids)
        # Weighed by its predicted device time: a long history costs more than a short one, a cached one less
        # (admission control needs a positive weight; a rank predicted at 0 ms still counts as a rank).
        cost_ms = max(engine.predicted_rank_ms(req.user_id, history, candidate_ids), 1e-3) \
            if st.admission is not None else 0.0
    _admit(st, cost_ms, last_try(st, affinity, request.headers.get(headers.ROUTED)), affinity or None)
    served = False
    try:
        result = engine.rank(req.user_id, history, candidate_ids, top_k=req.top_k)
        served = True
    finally:
        if st.admission is not None:
            st.admission.finish(served, cost_ms)
    g.relaygr_served_rank = True
    st.metrics.observe_rank(result, with_affinity=bool(affinity))
    ranking = [int(i) for i in result.ranking]
    timings = {k: float(v) for k, v in result.timings_ms.items()}
    timings["handler"] = (time.perf_counter() - t0) * 1e3
    response = jsonify({
        "scores": result.scores.tolist(),  # [num candidates][num tasks], request order
        "tasks": st.config.model.task_names,
        "ranking": ranking,  # candidate indices, best first
        "ranked_item_ids": [req.shown_candidates[i] for i in ranking],  # in the request's id space
        "id_space": req.id_space,
        "cache": result.cache,
        "truncated": bool(result.truncated),
        "ranked_events": int(result.ranked_events),  # the most recent events the scores saw
        "timings_ms": timings,
        "instance": st.instance_id,
        "model_version": engine.model_version,
    })
    response.headers[headers.CACHE] = result.cache
    return response


@contextmanager
def _parsing_slot(st: AppState, refuse: bool) -> Iterator[None]:
    """Hold one of serving.parse_slots while a read body is parsed and validated: many threads parsing at
    once under the interpreter lock would slow the admitted ranks. (Reading the body waits on the client
    and takes little CPU: a slot held through it would let a few stalled clients refuse everyone.) With
    `refuse`, a request that gets no slot within serving.parse_wait_ms is refused (503); else it waits."""
    timeout_s = st.settings.parse_wait_ms / 1e3 if refuse else None
    if not st.parsing.acquire(timeout=timeout_s):
        raise Overloaded(f"instance {st.instance_id} is overloaded: {st.settings.parse_slots} requests are being "
                         f"parsed, none finished within {st.settings.parse_wait_ms:g} ms")
    try:
        yield
    finally:
        st.parsing.release()


def last_try(st: AppState, key: str | None, routed: str | None) -> Callable[[], bool]:
    """Whether a rank with these affinity and X-RelayGR-Routed headers is on its last try: every other
    instance behind nginx has refused it (routed by the affinity hash, and this instance last in its key's
    try order). Hashes the key, so it is called only when the normal budget would refuse."""

    def last_resort() -> bool:
        return (st.upstream is not None and bool(key) and routed == "affinity"
                and st.upstream.is_last_try(key, st.settings.upstream_address))

    return last_resort


def _admit(st: AppState, cost_ms: float, on_last_try: Callable[[], bool], key: str | None) -> None:
    """Refuse the rank now (503 + Retry-After) unless it can still finish inside the ranking SLO; decided
    before it reaches the engine, so a refused rank costs the instance next to nothing. A rank on its last
    try (`on_last_try`) gets the looser relay.last_try_factor x SLO: refusing it would fail the request."""
    if st.admission is None or st.admission.try_admit(last_resort=on_last_try, size=cost_ms, key=key):
        return
    raise Overloaded(overloaded_message(st))


def overloaded_message(st: AppState) -> str:
    """The error of a rank refused by admission control: the queue it met."""
    view = st.admission.snapshot()
    return (f"instance {st.instance_id} is overloaded: {view.in_flight} ranks ahead, about "
            f"{view.work_ahead_ms:.0f} ms of work, admission budget {view.budget_ms:.0f} ms")


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    """Liveness: 200 while the process can serve or is warming up; 503 if the engine failed to start."""
    st = _state()
    body = {"status": "ok", "engine": st.holder.state, "instance": st.instance_id, "pid": os.getpid()}
    if st.holder.state == FAILED:
        body.update(status="failed", error=st.holder.error)
        return jsonify(body), 503
    return jsonify(body), 200


@bp.get("/readyz")
def readyz() -> Response:
    """Readiness: 200 only once the engine is warmed up and calibrated, and until SIGTERM (draining)."""
    st = _state()
    state = st.holder.state
    engine = st.holder.peek()
    body = {"status": state, "instance": st.instance_id,
            "model_version": engine.model_version if engine is not None else None}
    if st.holder.error:
        body["error"] = st.holder.error
    response = jsonify(body)
    if state != READY:
        response.status_code = 503
        response.headers[headers.RETRY_AFTER] = str(st.settings.retry_after_s)
    return response


@bp.get("/metrics")
def metrics() -> Response:
    """Prometheus text exposition."""
    payload, content_type = _state().metrics.render()
    return Response(payload, content_type=content_type)


@bp.get("/v1/stats")
def stats() -> Response:
    """Instance id, pid, model version, and the engine's cache, trigger and queue statistics."""
    st = _state()
    engine = st.holder.peek()
    ready = st.holder.state == READY
    serving = st.holder.serving and engine is not None  # also while draining
    return jsonify({
        "instance": st.instance_id,
        "pid": os.getpid(),
        "state": st.holder.state,
        "ready": ready,
        "model_version": engine.model_version if engine is not None else None,
        "engine": engine.stats().to_dict() if serving else None,
        "admission": st.admission.snapshot().to_dict() if st.admission is not None else None,
        "id_space": st.limits.default_id_space,  # of requests without an id_space field
        "catalogue": st.limits.catalogue.describe() if st.limits.catalogue is not None else None,
        "ranks_without_affinity": st.metrics.ranks_without_affinity,
    })


@bp.post("/v1/admin/flush")
def admin_flush() -> Response:
    """Drop every cached prefix of this instance (bearer token when serving.admin_token is set)."""
    st = _state()
    _check_admin(st.settings.admin_token)
    st.holder.get().flush()
    return jsonify({"flushed": True, "instance": st.instance_id})


def _check_admin(token: str | None) -> None:
    if token is None:
        return
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("missing or wrong bearer token")


@bp.before_app_request
def _before() -> None:
    g.relaygr_t0 = time.perf_counter()
    g.relaygr_cpu0 = cpu_clock()
    _state().holder.start()  # first request builds the engine when no post_fork hook did


@bp.after_app_request
def _after(response: Response) -> Response:
    st = _state()
    endpoint = _route_label()
    seconds = time.perf_counter() - g.get("relaygr_t0", time.perf_counter())
    method = request.method if request.method in KNOWN_METHODS else "other"  # bounded label values
    st.metrics.observe_request(endpoint, method, response.status_code, seconds,
                               response.headers.get(headers.CACHE))
    kind = g.get("relaygr_error")
    if response.status_code == 503 and kind in ("overloaded", "not_ready"):
        st.metrics.observe_rejection(endpoint, kind)
    response.headers[headers.INSTANCE] = st.instance_id
    drain_body(request.environ.get("wsgi.input"), request.content_length, 4 * st.settings.max_content_length)
    if st.admission is not None and not g.get("relaygr_served_rank"):  # the unit cost is fitted on ranks only
        st.admission.spent_elsewhere((cpu_clock() - g.get("relaygr_cpu0", cpu_clock())) * 1e3)
    return response


def _route_label() -> str:
    """The route a request addressed: its rule, also for a 405 (a known path, a method it does not
    allow); "unmatched" only for a path no route has."""
    if request.url_rule is not None:
        return request.url_rule.rule
    exc = request.routing_exception
    if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
        rule, _ = current_app.create_url_adapter(request).match(method=exc.valid_methods[0], return_rule=True)
        return rule.rule
    return "unmatched"


def drain_body(stream: Any, declared: int | None, max_bytes: int) -> None:
    """Read what the view left of the request body `stream` (404, 405, 413, an early 503...), up to `max_bytes`.

    gunicorn drains at most 64 KiB of an unread body and otherwise closes the kept-alive connection
    after the response, so a client (or nginx) reusing that connection would fail its next request.
    """
    if declared is not None and declared > max_bytes:
        return  # too big to be worth reading: gunicorn closes this connection
    if stream is None:
        return
    total = 0
    try:
        while total < max_bytes:
            chunk = stream.read(min(65536, max_bytes - total))
            if not chunk:
                return
            total += len(chunk)
    except (OSError, ValueError, RequestTimeout):  # the client went away or stalled mid-body
        return
