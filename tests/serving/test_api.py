"""The HTTP API on the Flask test client with a FakeEngine: every endpoint, every error class."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import BundleError, ConfigError, InvalidRequest, Overloaded
from mindspore_relaygr.model.inputs import validate_candidates, validate_history
from mindspore_relaygr.relay.executor import ExecutorClosed
from serving import headers
from serving.app import create_app
from serving.settings import resolve_settings
from tests.conftest import CONFIGS, REPO
from tests.serving.conftest import KNOWN_USER, FakeEngine, make_history, preinfer_body, rank_body
from tests.serving.fake_engine import fake_scores

JSON = "application/json"


def post(client, path, body, **kw):
    """POST as a client behind nginx would: a pre-infer carries its user's affinity header unless given."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    if path == "/v1/preinfer" and "headers" not in kw and isinstance(body, dict):
        kw["headers"] = {headers.AFFINITY: headers.encode_affinity(str(body.get("user_id", KNOWN_USER)))}
    return client.post(path, data=data, content_type=JSON, **kw)


# ---------------------------------------------------------------- happy paths


def test_preinfer_then_rank_is_served_from_the_cache(client, fake_engine, tiny_config):
    resp = post(client, "/v1/preinfer", preinfer_body(num_candidates=10))
    assert resp.status_code == 202
    assert resp.headers[headers.INSTANCE] == "t0"
    assert resp.json["admitted"] is True and resp.json["reason"] == "admitted"
    assert resp.json["cache_key"] and resp.json["instance"] == "t0"
    body = rank_body(top_k=3)
    resp = post(client, "/v1/rank", body)
    assert resp.status_code == 200
    assert resp.headers[headers.CACHE] == "device" and resp.json["cache"] == "device"
    assert resp.headers[headers.INSTANCE] == "t0"
    hist = validate_history(tiny_config.model, body["history"])
    want = fake_scores(hist, validate_candidates(tiny_config.model, body["candidates"]["item_ids"]), 2)
    np.testing.assert_array_equal(np.asarray(resp.json["scores"], np.float32), want)
    assert resp.json["tasks"] == ["engage", "high_rating"]
    assert resp.json["ranking"] == np.argsort(-want.sum(1), kind="stable")[:3].tolist()
    cands = body["candidates"]["item_ids"]
    assert resp.json["ranked_item_ids"] == [cands[i] for i in resp.json["ranking"]]
    assert resp.json["truncated"] is False and resp.json["model_version"] == "tiny-dev"
    assert set(resp.json["timings_ms"]) >= {"compute", "total", "handler"}


def test_preinfer_twice_reports_already_cached(client):
    assert post(client, "/v1/preinfer", preinfer_body()).json["reason"] == "admitted"
    again = post(client, "/v1/preinfer", preinfer_body())
    assert again.status_code == 202 and again.json == {**again.json, "admitted": False, "reason": "already_cached"}


def test_rank_without_preinfer_is_a_miss_and_top_k_is_clamped(client):
    resp = post(client, "/v1/rank", rank_body(user_id="stranger", top_k=1000))
    assert resp.status_code == 200 and resp.headers[headers.CACHE] == "miss"
    assert len(resp.json["ranking"]) == 10


def test_affinity_header_stands_in_for_the_user_id(client, fake_engine):
    body = preinfer_body()
    del body["user_id"]
    resp = post(client, "/v1/preinfer", body, headers={headers.AFFINITY: "from-header"})
    assert resp.status_code == 202 and fake_engine.calls[-1] == ("preinfer", "from-header")
    same = post(client, "/v1/preinfer", preinfer_body(user_id="u9"), headers={headers.AFFINITY: "u9"})
    assert same.status_code == 202 and fake_engine.calls[-1] == ("preinfer", "u9")


def test_healthz_readyz_and_stats_when_ready(client):
    resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json["status"] == "ok" and resp.json["engine"] == "ready"
    resp = client.get("/readyz")
    assert resp.status_code == 200 and resp.json == {"status": "ready", "instance": "t0", "model_version": "tiny-dev"}
    post(client, "/v1/preinfer", preinfer_body())
    resp = client.get("/v1/stats")
    assert resp.status_code == 200
    assert resp.json["instance"] == "t0" and resp.json["ready"] is True and resp.json["model_version"] == "tiny-dev"
    assert isinstance(resp.json["pid"], int)
    assert resp.json["engine"]["cache"]["device"]["num_ready"] == 1
    assert resp.json["engine"]["cache"]["dram"]["bytes_copied"] == 0  # a numpy scalar, serialised


def test_metrics_expose_latency_tiers_triggers_cache_and_rejections(client, fake_engine):
    post(client, "/v1/preinfer", preinfer_body())
    post(client, "/v1/rank", rank_body())
    post(client, "/v1/rank", rank_body(user_id="other"))
    fake_engine.overloaded = True
    post(client, "/v1/rank", rank_body())
    post(client, "/v1/rank", b"{")
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.content_type.startswith("text/plain")
    text = resp.get_data(as_text=True)
    for line in [
        'relaygr_request_latency_seconds_count{cache="device",endpoint="/v1/rank"} 1.0',
        'relaygr_request_latency_seconds_count{cache="miss",endpoint="/v1/rank"} 1.0',
        'relaygr_request_latency_seconds_count{cache="none",endpoint="/v1/preinfer"} 1.0',
        'relaygr_rank_requests_total{cache="device"} 1.0',
        'relaygr_rank_requests_total{cache="dram"} 0.0',
        'relaygr_trigger_decisions_total{reason="admitted"} 1.0',
        'relaygr_trigger_decisions_total{reason="footprint"} 0.0',
        'relaygr_rejections_total{endpoint="/v1/rank",reason="overloaded"} 1.0',
        'relaygr_http_requests_total{endpoint="/v1/rank",method="POST",status="503"} 1.0',
        'relaygr_http_requests_total{endpoint="/v1/rank",method="POST",status="400"} 1.0',
        'relaygr_cache_hits_total{tier="device"} 1.0',
        'relaygr_cache_misses_total{tier="device"} 1.0',
        'relaygr_cache_usage_bytes{tier="device"} 1024.0',
        'relaygr_cache_device_slots{state="free"} 3.0',
        'relaygr_cache_evictions_total{reason="lru",tier="device"} 0.0',
        "relaygr_queue_depth 0.0",
        "relaygr_engine_ready 1.0",
        "relaygr_truncations_total 0.0",
        'relaygr_rank_phase_seconds_count{phase="compute"} 2.0',
    ]:
        assert line in text, line
    assert 'relaygr_instance_info{instance="t0",model_version="tiny-dev"' in text


def test_metrics_of_two_apps_do_not_mix(tiny_config):
    a = create_app(tiny_config, engine=FakeEngine(tiny_config, "a")).test_client()
    b = create_app(tiny_config, engine=FakeEngine(tiny_config, "b")).test_client()
    post(a, "/v1/preinfer", preinfer_body())
    assert 'relaygr_trigger_decisions_total{reason="admitted"} 1.0' in a.get("/metrics").get_data(as_text=True)
    assert 'relaygr_trigger_decisions_total{reason="admitted"} 0.0' in b.get("/metrics").get_data(as_text=True)


def test_truncated_ranks_are_flagged_and_counted():
    cfg = load_config(CONFIGS / "tiny.yaml", ["relay.enabled=false", "relay.max_online_len=5"])
    client = create_app(cfg, engine=FakeEngine(cfg, "b0")).test_client()
    resp = post(client, "/v1/rank", rank_body(n=12))
    assert resp.status_code == 200 and resp.json["truncated"] is True and resp.headers[headers.CACHE] == "bypass"
    assert resp.json["ranked_events"] == 5
    assert post(client, "/v1/preinfer", preinfer_body()).json["reason"] == "disabled"
    assert "relaygr_truncations_total 1.0" in client.get("/metrics").get_data(as_text=True)


# ---------------------------------------------------------------- admin


def test_admin_flush_without_a_token(client, fake_engine):
    post(client, "/v1/preinfer", preinfer_body())
    assert fake_engine.cache_entry(KNOWN_USER) is not None
    resp = client.post("/v1/admin/flush")
    assert resp.status_code == 200 and resp.json == {"flushed": True, "instance": "t0"}
    assert fake_engine.cache_entry(KNOWN_USER) is None


@pytest.mark.parametrize("auth, status", [
    (None, 401), ("Bearer wrong-token", 401), ("Basic c2VjcmV0LXRva2Vu", 401), ("Bearer", 401),
    ("Bearer secret-token", 200), ("bearer secret-token", 200),
])
def test_admin_flush_with_a_token(tiny_config, auth, status):
    engine = FakeEngine(tiny_config, "t1")
    settings = resolve_settings(tiny_config, admin_token="secret-token")
    client = create_app(tiny_config, engine=engine, settings=settings).test_client()
    post(client, "/v1/preinfer", preinfer_body())
    resp = client.post("/v1/admin/flush", headers={"Authorization": auth} if auth else {})
    assert resp.status_code == status
    assert (engine.cache_entry(KNOWN_USER) is None) == (status == 200)
    if status == 401:
        assert resp.json["field"] == "Authorization" and resp.headers["WWW-Authenticate"].startswith("Bearer")


# ---------------------------------------------------------------- readiness and start-up


class SlowFactory:
    """Engine factory that blocks until released (a warm-up), or fails."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.fail = fail
        self.calls = 0

    def __call__(self, config, instance_id):
        self.calls += 1
        self.release.wait(10)
        if self.fail:
            raise BundleError("checkpoint missing")
        return FakeEngine(config, instance_id)


def test_engine_is_built_lazily_and_readyz_waits_for_it(tiny_config):
    factory = SlowFactory()
    settings = resolve_settings(tiny_config, instance_id="lazy", retry_after_s=3)
    app = create_app(tiny_config, engine_factory=factory, settings=settings)
    assert factory.calls == 0  # nothing built at app creation (that would be before fork)
    client = app.test_client()
    resp = client.get("/readyz")
    assert resp.status_code == 503 and resp.json["status"] == "starting" and resp.headers["Retry-After"] == "3"
    assert client.get("/healthz").status_code == 200
    resp = post(client, "/v1/rank", rank_body())
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "3" and "warming up" in resp.json["error"]
    assert post(client, "/v1/rank", b"{").status_code == 400  # validation does not need the engine
    assert client.get("/v1/stats").json == {**client.get("/v1/stats").json, "ready": False, "engine": None}
    assert "relaygr_engine_ready 0.0" in client.get("/metrics").get_data(as_text=True)
    factory.release.set()
    assert app.extensions["relaygr"].holder.wait(10)
    assert client.get("/readyz").status_code == 200
    assert post(client, "/v1/rank", rank_body()).status_code == 200
    assert factory.calls == 1
    text = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_rejections_total{endpoint="/v1/rank",reason="not_ready"} 1.0' in text


def test_failed_start_up_is_reported_by_healthz_and_readyz(tiny_config):
    factory = SlowFactory(fail=True)
    factory.release.set()
    app = create_app(tiny_config, engine_factory=factory)
    app.extensions["relaygr"].holder.start()
    assert not app.extensions["relaygr"].holder.wait(10)
    client = app.test_client()
    for path in ("/healthz", "/readyz"):
        resp = client.get(path)
        assert resp.status_code == 503 and resp.json["status"] == "failed"
        assert "BundleError: checkpoint missing" in resp.json["error"]
    resp = post(client, "/v1/rank", rank_body())
    assert resp.status_code == 503 and "failed to start" in resp.json["error"]


def test_serving_never_imports_mindspore():
    import subprocess
    import sys

    code = """
import sys
from mindspore_relaygr import load_config
from serving.app import create_app
from tests.conftest import CONFIGS, REPO
from tests.serving.conftest import KNOWN_USER, preinfer_body, rank_body
from tests.serving.fake_engine import FakeEngine
cfg = load_config("configs/tiny.yaml")
create_app(cfg)  # the production factory is only referenced, not called
app = create_app(cfg, engine_factory=FakeEngine.from_config)
c = app.test_client()
assert c.get("/healthz").status_code == 200
assert app.extensions["relaygr"].holder.wait(10)
assert c.post("/v1/preinfer", json=preinfer_body(), headers={"X-RelayGR-Affinity": KNOWN_USER}).status_code == 202
assert c.post("/v1/rank", json=rank_body()).status_code == 200
assert c.post("/v1/rank", data=b"{").status_code == 400
assert c.get("/metrics").status_code == 200 and c.get("/v1/stats").status_code == 200
assert "mindspore" not in sys.modules, "mindspore was imported"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-3000:]


# ---------------------------------------------------------------- errors: one table


def _with(body, path, value):
    """Copy of body with body[path...] = value (value DROP removes the key)."""
    body = json.loads(json.dumps(body))
    target = body
    for key in path[:-1]:
        target = target[key]
    if value is DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return body


DROP = object()
R, P = rank_body(), preinfer_body()
TOO_LONG = make_history(128, 1, user_features=[1, 2])  # tiny: max_seq_len 128 with a user token -> 127 events
ERRORS = [
    # (id, method, path, body, extra headers, status, field)
    ("malformed json", "POST", "/v1/rank", b'{"user_id": ', {}, 400, "body"),
    ("empty body", "POST", "/v1/rank", b"", {}, 400, "body"),
    ("array body", "POST", "/v1/preinfer", b"[]", {}, 400, "body"),
    ("NaN literal", "POST", "/v1/rank", json.dumps(R).replace(str(R["history"]["timestamps"][3]), "NaN").encode(),
     {}, 400, "body"),
    ("Infinity literal", "POST", "/v1/preinfer", b'{"user_id": "u", "history": {"item_ids": [1], "action_ids": [0], '
     b'"timestamps": [Infinity]}}', {}, 400, "body"),
    ("deep nesting", "POST", "/v1/rank", b"[" * 100000, {}, 400, "body"),
    ("invalid utf-8", "POST", "/v1/rank", b'\xff\xfe{"a": 1}', {}, 400, "body"),
    ("huge integer literal", "POST", "/v1/rank", b'{"top_k": ' + b"9" * 5000 + b"}", {}, 400, "body"),
    ("missing user_id", "POST", "/v1/rank", _with(R, ["user_id"], DROP), {}, 400, "user_id"),
    ("null user_id", "POST", "/v1/rank", _with(R, ["user_id"], None), {}, 400, "user_id"),
    ("int user_id", "POST", "/v1/preinfer", _with(P, ["user_id"], 42), {}, 400, "user_id"),
    ("empty user_id", "POST", "/v1/preinfer", _with(P, ["user_id"], ""), {}, 400, "user_id"),
    ("long user_id", "POST", "/v1/preinfer", _with(P, ["user_id"], "u" * 257), {}, 400, "user_id"),
    ("control char user_id", "POST", "/v1/rank", _with(R, ["user_id"], "a\nb"), {}, 400, "user_id"),
    ("zero-width space user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\u200b"), {}, 400, "user_id"),
    ("BOM user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\ufeff"), {}, 400, "user_id"),
    ("space user_id", "POST", "/v1/rank", _with(R, ["user_id"], " "), {}, 400, "user_id"),
    ("invisible user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\u200b\u3000\u2028\u00a0"), {}, 400, "user_id"),
    # letters, marks and symbols that render as nothing: variation selector, Hangul fillers, blank braille
    ("variation selector user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\ufe0f"), {}, 400, "user_id"),
    ("Hangul filler user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\u3164 \u115f\uffa0"), {}, 400, "user_id"),
    ("blank braille user_id", "POST", "/v1/rank", _with(R, ["user_id"], "\u2800\u034f"), {}, 400, "user_id"),
    ("affinity mismatch", "POST", "/v1/rank", R, {headers.AFFINITY: "someone-else"}, 400, "user_id"),
    ("affinity too long", "POST", "/v1/rank", R, {headers.AFFINITY: "a" * 300}, 400, headers.AFFINITY),
    ("missing history", "POST", "/v1/preinfer", _with(P, ["history"], DROP), {}, 400, "history"),
    ("history is a list", "POST", "/v1/rank", _with(R, ["history"], [1, 2]), {}, 400, "history"),
    ("missing item_ids", "POST", "/v1/rank", _with(R, ["history", "item_ids"], DROP), {}, 400, "history.item_ids"),
    ("unknown history key", "POST", "/v1/rank", _with(R, ["history", "ratings"], [1]), {}, 400, "history.ratings"),
    ("item_ids a string", "POST", "/v1/rank", _with(R, ["history", "item_ids"], "1,2"), {}, 400, "history.item_ids"),
    ("item id float", "POST", "/v1/rank", _with(R, ["history", "item_ids", 2], 1.5), {}, 400, "history.item_ids"),
    ("item id 3.0", "POST", "/v1/rank", _with(R, ["history", "item_ids", 2], 3.0), {}, 400, "history.item_ids"),
    ("item id bool", "POST", "/v1/rank", _with(R, ["history", "item_ids", 0], True), {}, 400, "history.item_ids"),
    ("item id null", "POST", "/v1/rank", _with(R, ["history", "item_ids", 0], None), {}, 400, "history.item_ids"),
    ("negative item id", "POST", "/v1/rank", _with(R, ["history", "item_ids", 1], -3), {}, 400, "history.item_ids"),
    ("padding item id 0", "POST", "/v1/preinfer", _with(P, ["history", "item_ids", 1], 0), {}, 400,
     "history.item_ids"),
    ("unknown item id", "POST", "/v1/rank", _with(R, ["history", "item_ids", 1], 201), {}, 400, "history.item_ids"),
    ("huge item id", "POST", "/v1/rank", _with(R, ["history", "item_ids", 1], 10**30), {}, 400, "history.item_ids"),
    ("action out of range", "POST", "/v1/rank", _with(R, ["history", "action_ids", 0], 4), {}, 400,
     "history.action_ids"),
    ("negative timestamp", "POST", "/v1/rank", _with(R, ["history", "timestamps", 0], -1), {}, 400,
     "history.timestamps"),
    ("float timestamp", "POST", "/v1/rank", _with(R, ["history", "timestamps", 0], 1.7e9), {}, 400,
     "history.timestamps"),
    ("timestamp too large", "POST", "/v1/rank", _with(R, ["history", "timestamps", 0], 2**41), {}, 400,
     "history.timestamps"),
    ("timestamps go backwards", "POST", "/v1/rank",
     _with(R, ["history", "timestamps", 5], R["history"]["timestamps"][4] - 1), {}, 400, "history.timestamps"),
    ("timestamps go backwards (pre-infer)", "POST", "/v1/preinfer",
     _with(P, ["history", "timestamps", 0], P["history"]["timestamps"][1] + 1), {}, 400, "history.timestamps"),
    ("lengths differ", "POST", "/v1/rank", _with(R, ["history", "action_ids"], [0] * 19), {}, 400, "history"),
    ("history too long", "POST", "/v1/preinfer", _with(P, ["history"], TOO_LONG), {}, 400, "history.item_ids"),
    ("user_features count", "POST", "/v1/rank", _with(R, ["history", "user_features"], [1]), {}, 400,
     "history.user_features"),
    ("user_features range", "POST", "/v1/rank", _with(R, ["history", "user_features"], [3, 0]), {}, 400,
     "history.user_features"),
    ("missing candidates", "POST", "/v1/rank", _with(R, ["candidates"], DROP), {}, 400, "candidates"),
    ("candidates a list", "POST", "/v1/rank", _with(R, ["candidates"], [1, 2]), {}, 400, "candidates"),
    ("empty candidates", "POST", "/v1/rank", _with(R, ["candidates", "item_ids"], []), {}, 400,
     "candidates.item_ids"),
    ("too many candidates", "POST", "/v1/rank", _with(R, ["candidates", "item_ids"], [1] * 33), {}, 400,
     "candidates.item_ids"),
    ("huge candidate list", "POST", "/v1/rank", _with(R, ["candidates", "item_ids"], [1] * 30000), {}, 400,
     "candidates.item_ids"),
    ("unknown candidate", "POST", "/v1/rank", _with(R, ["candidates", "item_ids", 0], 999), {}, 400,
     "candidates.item_ids"),
    ("unknown candidates key", "POST", "/v1/rank", _with(R, ["candidates", "scores"], []), {}, 400,
     "candidates.scores"),
    ("top_k zero", "POST", "/v1/rank", _with(R, ["top_k"], 0), {}, 400, "top_k"),
    ("top_k negative", "POST", "/v1/rank", _with(R, ["top_k"], -2), {}, 400, "top_k"),
    ("top_k string", "POST", "/v1/rank", _with(R, ["top_k"], "5"), {}, 400, "top_k"),
    ("top_k float", "POST", "/v1/rank", _with(R, ["top_k"], 2.5), {}, 400, "top_k"),
    ("top_k bool", "POST", "/v1/rank", _with(R, ["top_k"], True), {}, 400, "top_k"),
    ("num_candidates zero", "POST", "/v1/preinfer", _with(P, ["num_candidates"], 0), {}, 400, "num_candidates"),
    ("num_candidates too big", "POST", "/v1/preinfer", _with(P, ["num_candidates"], 33), {}, 400, "num_candidates"),
    ("unknown top-level field", "POST", "/v1/rank", _with(R, ["topk"], 5), {}, 400, "topk"),
    ("candidates on preinfer", "POST", "/v1/preinfer", _with(P, ["candidates"], {"item_ids": [1]}), {}, 400,
     "candidates"),
    ("body over the limit", "POST", "/v1/rank", _with(R, ["pad"], "x" * (300 * 1024)), {}, 413, "body"),
    ("unknown route", "GET", "/v1/nope", None, {}, 404, None),
    ("unknown POST route", "POST", "/v2/rank", R, {}, 404, None),
    ("double slash", "POST", "/v1//rank", R, {}, 404, None),  # not a 308 redirect in HTML
    ("double slash admin", "POST", "//v1/admin/flush", None, {}, 404, None),
    ("GET on rank", "GET", "/v1/rank", None, {}, 405, None),
    ("PUT on preinfer", "PUT", "/v1/preinfer", P, {}, 405, None),
    ("POST on healthz", "POST", "/healthz", None, {}, 405, None),
    ("GET on admin flush", "GET", "/v1/admin/flush", None, {}, 405, None),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_bad_requests_get_a_json_4xx_and_never_reach_the_engine(client, fake_engine, case):
    _, method, path, body, extra, status, field = case
    post(client, "/v1/preinfer", preinfer_body())  # the known user's entry must survive
    entry = fake_engine.cache_entry(KNOWN_USER)
    calls = len(fake_engine.calls)
    data = body if isinstance(body, bytes | type(None)) else json.dumps(body).encode()
    if path == "/v1/preinfer":
        extra = {headers.AFFINITY: KNOWN_USER, **extra}
    resp = client.open(path, method=method, data=data, content_type=JSON, headers=extra)
    assert resp.status_code == status, resp.get_data(as_text=True)[:500]
    assert resp.content_type == JSON and set(resp.json) == {"error", "field"}
    assert resp.json["field"] == field and resp.json["error"]
    assert resp.headers[headers.INSTANCE] == "t0"
    assert len(fake_engine.calls) == calls and fake_engine.cache_entry(KNOWN_USER) == entry
    if status == 405:
        assert resp.headers["Allow"]
    assert post(client, "/v1/rank", rank_body()).headers[headers.CACHE] == "device"


ENGINE_ERRORS = [
    ("engine InvalidRequest", InvalidRequest("history", "too long for the cache"), 400, "history"),
    ("overloaded", Overloaded("queue would miss the SLO"), 503, None),
    ("executor closed", ExecutorClosed("closed"), 503, None),
    ("bundle error", BundleError("bundle is corrupt"), 500, None),
    ("config error", ConfigError("bad"), 500, None),
    ("unexpected bug", RuntimeError("boom"), 500, None),
    ("key error", KeyError("slot"), 500, None),
]


@pytest.mark.parametrize("case", ENGINE_ERRORS, ids=[c[0] for c in ENGINE_ERRORS])
@pytest.mark.parametrize("endpoint", ["/v1/rank", "/v1/preinfer"])
def test_engine_errors_map_to_json_statuses_and_the_app_keeps_serving(client, fake_engine, case, endpoint):
    _, exc, status, field = case
    fake_engine.fail_with = exc
    body = rank_body() if endpoint == "/v1/rank" else preinfer_body()
    resp = post(client, endpoint, body)
    assert resp.status_code == status and resp.content_type == JSON
    assert resp.json["field"] == field and resp.json["error"]
    if status == 503:
        assert resp.headers["Retry-After"] == "1"
    assert post(client, endpoint, body).status_code in (200, 202)


def test_engine_errors_are_counted_by_status(client, fake_engine):
    fake_engine.fail_with = RuntimeError("boom")
    post(client, "/v1/rank", rank_body())
    text = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_http_requests_total{endpoint="/v1/rank",method="POST",status="500"} 1.0' in text
    assert 'endpoint="unmatched"' not in text
    client.get("/nope/" + "x" * 50)
    client.open("/v1/rank", method="FROB")
    text = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_http_requests_total{endpoint="unmatched",method="GET",status="404"} 1.0' in text
    assert 'relaygr_http_requests_total{endpoint="/v1/rank",method="other",status="405"} 1.0' in text


def test_concurrent_requests_on_one_app(client):
    errors = []

    def worker(i):
        for j in range(10):
            resp = post(client, "/v1/rank", rank_body(user_id=f"c{i}", seed=j))
            if resp.status_code != 200:
                errors.append(resp.status_code)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and time.monotonic() - t0 < 30


def test_a_forked_child_builds_its_own_engine(tiny_config):
    import os

    built = []

    def factory(config, instance_id):
        built.append(os.getpid())
        return FakeEngine(config, instance_id)

    app = create_app(tiny_config, engine_factory=factory)
    holder = app.extensions["relaygr"].holder
    assert holder.wait(10) and built == [os.getpid()]
    holder._pid = -1  # as if this process were a fork of the one that built it
    resp = app.test_client().get("/readyz")  # the first request restarts the build here
    assert resp.status_code in (200, 503)
    assert holder.wait(10) and built == [os.getpid(), os.getpid()]
