"""Rank admission through the HTTP layer: beyond the SLO budget a rank gets 503 + Retry-After at once,
before its body is read, and the instance keeps serving what it admitted."""

from __future__ import annotations

import json
import threading

from mindspore_relaygr.config import load_config
from serving.app import create_app
from serving.settings import resolve_settings
from tests.conftest import CONFIGS
from tests.serving.conftest import FakeEngine, rank_body


class BlockingEngine(FakeEngine):
    """Ranks wait until `release` is set, so admitted ranks stay in flight."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)

    def rank(self, *args, **kwargs):
        self.entered.release()
        assert self.release.wait(30), "test never released the ranks"
        return super().rank(*args, **kwargs)


def make_app(fraction: float | None):
    overrides = ["trigger.slo_ms=80", f"relay.admission_fraction={'null' if fraction is None else fraction}"]
    config = load_config(CONFIGS / "tiny.yaml", overrides)
    engine = BlockingEngine(config, instance_id="a0")
    app = create_app(config, engine=engine, settings=resolve_settings(config, instance_id="a0"))
    return app, engine


def post_rank(client, body) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = client.post("/v1/rank", data=data, content_type="application/json")
    return resp.status_code, resp.get_json(), dict(resp.headers)


def test_ranks_beyond_the_budget_are_refused_at_once_and_admitted_ones_are_served():
    app, engine = make_app(fraction=0.5)  # budget 40 ms; before any departure a rank counts 5 ms: 8 admitted
    client = app.test_client()
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(post_rank(client, rank_body(f"u{i}"))[0]))
               for i in range(8)]
    for t in threads:
        t.start()
    for _ in threads:
        assert engine.entered.acquire(timeout=30)
    status, body, hdrs = post_rank(client, b"{not json")  # refused before the body is parsed
    assert status == 503 and hdrs["Retry-After"] == "1"
    assert body["field"] is None and "8 ranks ahead" in body["error"] and "budget 40 ms" in body["error"]
    stats = client.get("/v1/stats").get_json()["admission"]
    assert (stats["in_flight"], stats["admitted"], stats["rejected"]) == (8, 8, 1)
    engine.release.set()
    for t in threads:
        t.join(30)
    assert results == [200] * 8
    assert post_rank(client, rank_body("after"))[0] == 200
    assert client.get("/v1/stats").get_json()["admission"]["in_flight"] == 0
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_rejections_total{endpoint="/v1/rank",reason="overloaded"} 1.0' in metrics


def test_a_bad_request_leaves_the_queue():
    app, engine = make_app(fraction=0.5)
    engine.release.set()
    client = app.test_client()
    for _ in range(20):  # more 400s than the budget admits at once: each one left the queue
        assert post_rank(client, {"user_id": "u", "history": {}})[0] == 400
    assert client.get("/v1/stats").get_json()["admission"]["in_flight"] == 0
    assert post_rank(client, rank_body("ok"))[0] == 200


def test_admission_off_admits_everything():
    app, engine = make_app(fraction=None)
    client = app.test_client()
    threads = [threading.Thread(target=post_rank, args=(client, rank_body(f"u{i}"))) for i in range(12)]
    for t in threads:
        t.start()
    for _ in threads:
        assert engine.entered.acquire(timeout=30)  # all twelve reached the engine
    engine.release.set()
    for t in threads:
        t.join(30)
    assert client.get("/v1/stats").get_json()["admission"] is None
