"""Affinity is never silently lost: behind nginx a request without X-RelayGR-Affinity is round-robined, so a
pre-infer without it is refused (400) and a rank without it is served and counted."""

from __future__ import annotations

from serving import headers
from tests.serving.conftest import KNOWN_USER, preinfer_body, rank_body


def test_a_preinfer_without_the_affinity_header_is_a_400_naming_it(client, fake_engine):
    for hdrs in ({}, {headers.AFFINITY: ""}):
        resp = client.post("/v1/preinfer", json=preinfer_body(), headers=hdrs)
        assert resp.status_code == 400
        assert resp.json["field"] == headers.AFFINITY
        assert "percent-encoded user id" in resp.json["error"]
    assert sum(fake_engine.stats().preinfers.values()) == 0  # never reached the engine
    ok = client.post("/v1/preinfer", json=preinfer_body(), headers={headers.AFFINITY: KNOWN_USER})
    assert ok.status_code == 202


def test_a_rank_without_the_affinity_header_is_served_and_counted(client):
    assert client.get("/v1/stats").json["ranks_without_affinity"] == 0
    assert client.post("/v1/rank", json=rank_body()).status_code == 200
    assert client.post("/v1/rank", json=rank_body(), headers={headers.AFFINITY: KNOWN_USER}).status_code == 200
    assert client.post("/v1/rank", json={"user_id": "u"}).status_code == 400  # not served: not counted
    assert client.get("/v1/stats").json["ranks_without_affinity"] == 1
    assert "relaygr_ranks_without_affinity_total 1.0" in client.get("/metrics").get_data(as_text=True)
