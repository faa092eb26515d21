"""Any Unicode user id: the percent-encoded affinity header, validation, the client, nginx routing."""

from __future__ import annotations

import json
import string
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.serving import make_server
from werkzeug.wsgi import LimitedStream

from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import headers
from serving.client import RelayGRClient
from serving.cluster import read_state
from serving.headers import decode_affinity, encode_affinity
from tests.serving.conftest import preinfer_body, rank_body
from tests.serving.servers import FAKE_FACTORY, cluster

TRICKY = [
    "u42", "é", "用户1", "🙂", "👨\u200d👩\u200d👧", "50% off", "%", "%25", "a%41", "%%zz", "a+b", " lead trail ",
    "a:b@c.d/e?f=g&h#i;j,k", "tab\there", "\x00\x7f\x85", "\u2028\ufeff\u00a0", string.printable, "\U0010ffff",
    "x" * 300,
]
UNICODE_IDS = ["é", "用户1", "🙂", "👨\u200d👩\u200d👧", "50% off", "a%41 b", " a ", "Ω≈ç√∫"]
HEADER_CHARS = set(string.ascii_letters + string.digits + string.punctuation)  # no space, no control


def post(client, path, body, affinity=None, raw_utf8=False):
    data = json.dumps(body, ensure_ascii=not raw_utf8).encode("utf-8")
    hdrs = {} if affinity is None else {headers.AFFINITY: affinity}
    return client.post(path, data=data, content_type="application/json", headers=hdrs)


# ---------------------------------------------------------------- the encoding rule


@pytest.mark.parametrize("user_id", TRICKY, ids=repr)
def test_encode_decode_round_trips_to_a_plain_ascii_header_value(user_id):
    encoded = encode_affinity(user_id)
    assert set(encoded) <= HEADER_CHARS  # sendable as is, and no leading/trailing space to be stripped
    assert decode_affinity(encoded) == user_id


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text())  # hypothesis leaves out lone surrogates, which have no UTF-8 form
def test_encode_decode_round_trips_for_any_text(user_id):
    encoded = encode_affinity(user_id)
    assert set(encoded) <= HEADER_CHARS and decode_affinity(encoded) == user_id


def test_the_encoding_is_pinned():
    # nginx hashes these exact strings: changing the rule moves users between instances.
    ascii_ids = ["u42", "user-7", "a@b.c", "x_y.z~", "Key:1/2", string.punctuation.replace("%", "")]
    assert [encode_affinity(u) for u in ascii_ids] == ascii_ids
    assert encode_affinity("é") == "%C3%A9"
    assert encode_affinity("用户1") == "%E7%94%A8%E6%88%B71"
    assert encode_affinity("🙂") == "%F0%9F%99%82"
    assert encode_affinity("50% off") == "50%25%20off"
    assert encode_affinity("a%41") == "a%2541"
    assert decode_affinity("%c3%a9") == "é"  # lower-case hex is accepted (but not what clients send)
    assert decode_affinity("a b") == "a b"  # an unencoded ASCII space inside still decodes to itself
    with pytest.raises(UnicodeEncodeError):
        encode_affinity("\ud800")


@pytest.mark.parametrize("value", ["%", "50%", "%zz", "%4", "%C3", "%FF", "%ED%A0%80", "%C0%AF", "é", "Ã©", "用户1"],
                         ids=repr)
def test_decode_rejects_what_is_not_percent_encoded_utf8(value):
    with pytest.raises(ValueError):
        decode_affinity(value)


# ---------------------------------------------------------------- the API (Flask test client, FakeEngine)


@pytest.mark.parametrize("user_id", ["é", "用户1", "👨\u200d👩\u200d👧", "50% off"])
@pytest.mark.parametrize("mode", ["header_and_body", "header_only", "body_only", "header_and_raw_utf8_body"])
def test_preinfer_and_rank_with_a_unicode_user_id(client, fake_engine, user_id, mode):
    pre, rank = preinfer_body(user_id), rank_body(user_id)
    if mode == "header_only":
        del pre["user_id"], rank["user_id"]
    affinity = None if mode == "body_only" else encode_affinity(user_id)
    raw = mode == "header_and_raw_utf8_body"
    # a pre-infer without the header is a 400 (test_affinity_rule): body_only applies to the rank
    resp = post(client, "/v1/preinfer", pre, affinity or encode_affinity(user_id), raw)
    assert resp.status_code == 202, resp.json
    assert fake_engine.calls[-1] == ("preinfer", user_id)
    resp = post(client, "/v1/rank", rank, affinity, raw)
    assert resp.status_code == 200, resp.json
    assert fake_engine.calls[-1] == ("rank", user_id)
    assert resp.headers[headers.CACHE] == "device"  # the rank found the pre-infer's entry: same user key


@pytest.mark.parametrize("user_id", ["a\u200b", "\u200b.", " 7 ", "\u0301", "\U0001f642\ufeff", "\u2764\ufe0f",
                                     "\u3164\ud55c"], ids=repr)
def test_one_visible_character_makes_a_user_id(client, fake_engine, user_id):
    assert post(client, "/v1/rank", rank_body(user_id), encode_affinity(user_id)).status_code == 200
    assert fake_engine.calls[-1] == ("rank", user_id)


def test_user_id_length_counts_characters_not_bytes(client, fake_engine):
    longest = "é" * 256  # 512 UTF-8 bytes, 3072 header characters
    assert post(client, "/v1/rank", rank_body(longest), encode_affinity(longest)).status_code == 200
    assert fake_engine.calls[-1] == ("rank", longest)
    too_long = "é" * 257
    resp = post(client, "/v1/rank", rank_body(too_long))
    assert resp.status_code == 400 and resp.json["field"] == "user_id"
    body = rank_body()
    del body["user_id"]
    resp = post(client, "/v1/rank", body, encode_affinity(too_long))
    assert resp.status_code == 400 and resp.json["field"] == headers.AFFINITY


@pytest.mark.parametrize("value", ["%", "50%", "%zz", "%C3", "%ED%A0%80", "é"], ids=repr)
@pytest.mark.parametrize("endpoint", ["/v1/rank", "/v1/preinfer"])
def test_a_header_that_is_not_percent_encoded_utf8_is_a_400_naming_it(client, fake_engine, value, endpoint):
    body = rank_body("é") if endpoint == "/v1/rank" else preinfer_body("é")
    resp = post(client, endpoint, body, value)
    assert resp.status_code == 400
    assert set(resp.json) == {"error", "field"} and resp.json["field"] == headers.AFFINITY
    assert "percent-encoded UTF-8" in resp.json["error"]
    assert not fake_engine.calls


@pytest.mark.parametrize(("body_id", "affinity", "field"), [
    ("é", "e", "user_id"),  # decoded header differs from the body
    ("é", "%C3%A9%20", "user_id"),
    ("a%41", "a%41", "user_id"),  # the header decodes to "aA": a literal '%' must be sent as %25
    ("a\nb", None, "user_id"),  # control characters stay forbidden
    ("a\nb", encode_affinity("a\nb"), headers.AFFINITY),  # the header is checked first
    (None, encode_affinity("a\nb"), headers.AFFINITY),
    (None, "%C2%85", headers.AFFINITY),  # C1 control (NEL)
    ("\ud800", None, "user_id"),  # a lone surrogate (JSON "\ud800") has no UTF-8 form
    # no visible character: a log line or a dashboard would show an empty user
    ("\u200b", None, "user_id"),  # zero-width space
    ("\ufeff \u00a0", None, "user_id"),  # byte order mark, spaces
    (None, encode_affinity("\u200b\u200d"), headers.AFFINITY),
    (None, "%20", headers.AFFINITY),
    (None, encode_affinity("\ufe0f\u3164"), headers.AFFINITY),  # a variation selector and a Hangul filler
])
def test_mismatched_or_invalid_ids_are_400s(client, fake_engine, body_id, affinity, field):
    body = rank_body(body_id)
    if body_id is None:
        del body["user_id"]
    resp = post(client, "/v1/rank", body, affinity)
    assert resp.status_code == 400 and resp.json["field"] == field, resp.json
    assert not fake_engine.calls


# ---------------------------------------------------------------- the Python client over real HTTP


@pytest.fixture
def live_app(app):
    """The test app behind a werkzeug server on 127.0.0.1; yields (url, affinity header values received)."""
    seen: list[str | None] = []
    inner = app.wsgi_app

    def recording(environ, start_response):
        seen.append(environ.get("HTTP_X_RELAYGR_AFFINITY"))
        # Bound the body like gunicorn does: the app drains wsgi.input after each response.
        environ["wsgi.input"] = LimitedStream(environ["wsgi.input"], int(environ.get("CONTENT_LENGTH") or 0))
        return inner(environ, start_response)

    app.wsgi_app = recording
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("user_id", ["é", "用户1", "🙂", "50% off"])
def test_the_client_sends_unicode_ids_encoded(live_app, fake_engine, user_id):
    url, seen = live_app
    client = RelayGRClient(url, timeout_s=30)
    try:
        client.preinfer(user_id, preinfer_body()["history"])
        result = client.rank(user_id, rank_body()["history"], list(range(1, 11)), top_k=3)
    finally:
        client.close()
    assert result.body["cache"] == "device" and result.instance == "t0"
    assert fake_engine.calls == [("preinfer", user_id), ("rank", user_id)]
    assert seen == [encode_affinity(user_id)] * 2


# ---------------------------------------------------------------- a real nginx cluster


@pytest.mark.slow
def test_cluster_routes_unicode_users_where_the_python_port_predicts(tmp_path):
    with cluster(tmp_path, 2, engine_factory=FAKE_FACTORY) as (url, proc, run_dir, port):
        members = {f"127.0.0.1:{m.port}": m.name for m in read_state(run_dir) if m.name != "nginx"}
        ring = NginxConsistentHash(list(members))
        client = RelayGRClient(url, timeout_s=60)
        try:
            for user in UNICODE_IDS:
                expected = members[ring.route(encode_affinity(user))]
                pre = client.preinfer(user, preinfer_body()["history"])
                rank = client.rank(user, rank_body()["history"], list(range(1, 11)))
                assert pre.instance == rank.instance == expected, user
                assert rank.body["cache"] == "device", user
        finally:
            client.close()
        assert len({members[ring.route(encode_affinity(u))] for u in UNICODE_IDS}) == 2  # not vacuous
