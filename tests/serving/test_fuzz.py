"""Bounded fuzzing of the app (Flask test client, FakeEngine): zero 5xx, the known user's cache untouched."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving import headers
from serving.app import create_app
from serving.schemas import Limits
from serving.settings import resolve_settings
from tests.serving.conftest import KNOWN_USER, FakeEngine, preinfer_body, rank_body
from tests.serving.fuzz import EXPECTED_STATUSES, HostileRequests

MAX_BODY = 256 * 1024


def send(client, probe):
    return client.open(probe.path, method=probe.method, data=probe.body, headers=probe.headers)


def test_hostile_requests_all_get_4xx_and_leave_the_known_user_alone(tiny_config):
    engine = FakeEngine(tiny_config, "f0")
    settings = resolve_settings(tiny_config, max_content_length=MAX_BODY)
    client = create_app(tiny_config, engine=engine, settings=settings).test_client()
    assert client.post("/v1/preinfer", json=preinfer_body(), headers={headers.AFFINITY: KNOWN_USER}).json["admitted"]
    entry = engine.cache_entry(KNOWN_USER)
    calls = len(engine.calls)
    probes = HostileRequests(seed=1234, limits=Limits.from_config(tiny_config), known_user=KNOWN_USER,
                             max_body=MAX_BODY).probes(400)
    statuses = Counter()
    for probe in probes:
        resp = send(client, probe)
        statuses[resp.status_code] += 1
        assert resp.status_code in EXPECTED_STATUSES, (probe.what, resp.status_code, resp.get_data()[:300])
        body = resp.json
        assert set(body) == {"error", "field"}, probe.what
        if resp.status_code == 400:
            assert body["field"], probe.what
    assert len(engine.calls) == calls, "a hostile request reached the engine"
    assert engine.cache_entry(KNOWN_USER) == entry
    resp = client.post("/v1/rank", json=rank_body())
    assert resp.status_code == 200 and resp.headers[headers.CACHE] == "device"
    assert statuses[400] > 300 and set(statuses) >= {400, 404, 405}  # the mix is not degenerate


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)
FIELDS = ["user_id", "history", "candidates", "top_k", "num_candidates", "item_ids", "action_ids", "timestamps",
          "user_features"]
STRUCTURED = st.fixed_dictionaries({}, optional={
    "user_id": JSON_VALUES | st.text(min_size=1, max_size=10),
    "history": st.fixed_dictionaries({}, optional={k: JSON_VALUES | st.lists(st.integers(-5, 300), max_size=8)
                                                   for k in FIELDS[5:]}) | JSON_VALUES,
    "candidates": st.fixed_dictionaries({}, optional={"item_ids": st.lists(st.integers(-5, 300), max_size=40)}),
    "top_k": JSON_VALUES,
    "num_candidates": JSON_VALUES,
})


@settings(max_examples=250, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(body=STRUCTURED | JSON_VALUES, endpoint=st.sampled_from(["/v1/rank", "/v1/preinfer"]),
       affinity=st.none() | st.text(max_size=8).filter(str.isprintable))
def test_arbitrary_json_never_gets_a_5xx(tiny_config, body, endpoint, affinity):
    engine = FakeEngine(tiny_config, "h0")
    client = create_app(tiny_config, engine=engine).test_client()
    hdrs = {headers.AFFINITY: affinity.encode("latin-1", "replace").decode("latin-1")} if affinity else {}
    resp = client.post(endpoint, data=json.dumps(body).encode(), content_type="application/json", headers=hdrs)
    assert resp.status_code < 500, resp.get_data()[:500]
    assert resp.status_code in (200, 202, 400), resp.status_code
    if resp.status_code == 400:
        assert resp.json["field"]
