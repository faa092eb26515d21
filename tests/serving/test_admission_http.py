"""Rank admission through the HTTP layer: beyond the SLO budget a rank gets 503 + Retry-After at once,
before it reaches the engine, and the instance keeps serving what it admitted. The fake engine predicts
PREDICTED_MS_PER_EVENT per event, so rank_body's 20 events weigh 5 ms."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading

import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError, InvalidRequest
from mindspore_relaygr.relay.admission import AdmissionControl
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import api
from serving.app import create_app
from serving.settings import resolve_settings
from tests.conftest import CONFIGS
from tests.relay.test_admission import FakeClock
from tests.serving.conftest import FakeEngine, preinfer_body, rank_body
from tests.serving.fake_engine import PREDICTED_MS_PER_EVENT


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> FakeClock:
    """The apps' admission control reads this clock: time stands still unless a test advances it, so the
    blocked ranks' service time (credited as work done) is what the test says."""
    fake = FakeClock()
    monkeypatch.setattr("serving.app.AdmissionControl", functools.partial(AdmissionControl, clock=fake))
    return fake


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


def test_ranks_beyond_the_budget_are_refused_at_once_and_admitted_ones_are_served(clock):
    app, engine = make_app(fraction=0.5)  # budget 40 ms; before any departure 5 predicted ms cost 5 ms:
    # 8 admitted at once
    client = app.test_client()
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(post_rank(client, rank_body(f"u{i}"))[0]))
               for i in range(8)]
    for t in threads:
        t.start()
    for _ in threads:
        assert engine.entered.acquire(timeout=30)
    # Once the first has been in service for one rank's time (5 ms), that much of the 40 ms is done: one more fits.
    clock.advance_ms(5.0)
    threads.append(threading.Thread(target=lambda: results.append(post_rank(client, rank_body("u8"))[0])))
    threads[-1].start()
    assert engine.entered.acquire(timeout=30)
    status, body, hdrs = post_rank(client, rank_body("late"))  # 45 - 5 + 5 > 40
    assert status == 503 and hdrs["Retry-After"] == "1"
    assert body["field"] is None and "9 ranks ahead" in body["error"] and "budget 40 ms" in body["error"]
    assert "about 40 ms of work" in body["error"]  # what remains: 45 ms predicted, 5 of them served
    assert post_rank(client, b"{not json")[0] == 400  # a bad request is told so, loaded or not, and takes no budget
    stats = client.get("/v1/stats").get_json()["admission"]
    assert (stats["in_flight"], stats["admitted"], stats["rejected"]) == (9, 9, 1)
    assert stats["work"] == pytest.approx(9 * 20 * PREDICTED_MS_PER_EVENT)
    assert stats["served_ms"] == pytest.approx(20 * PREDICTED_MS_PER_EVENT)
    engine.release.set()
    for t in threads:
        t.join(30)
    assert results == [200] * 9
    assert post_rank(client, rank_body("after"))[0] == 200
    assert client.get("/v1/stats").get_json()["admission"]["in_flight"] == 0
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'relaygr_rejections_total{endpoint="/v1/rank",reason="overloaded"} 1.0' in metrics


def test_a_bad_request_leaves_the_queue():
    app, engine = make_app(fraction=0.5)
    engine.release.set()
    client = app.test_client()
    for _ in range(20):  # refused by the parser, before admission
        assert post_rank(client, {"user_id": "u", "history": {}})[0] == 400
    # Admitted, then refused by the engine: more of them than the budget admits at once (8 x 5 ms in 40 ms),
    # so the later ones would be refused with a 503 if an earlier one had stayed in the queue.
    for _ in range(20):
        engine.fail_with = InvalidRequest("history", "refused after admission")
        status, body, _ = post_rank(client, rank_body("bad"))
        assert status == 400 and body["field"] == "history"
    assert [c for c in engine.calls if c[0] == "rank"] == [("rank", "bad")] * 20  # each one reached the engine
    admission = client.get("/v1/stats").get_json()["admission"]
    assert admission["in_flight"] == 0 and admission["work_ahead_ms"] == 0
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


def make_member_app(slo_ms: float = 80.0):
    """Instance 127.0.0.1:8001 of a two-instance nginx upstream, budget 0.5 x SLO, last tries 1 x SLO."""
    config = load_config(CONFIGS / "tiny.yaml", [f"trigger.slo_ms={slo_ms}", "relay.admission_fraction=0.5",
                                                 "relay.last_try_factor=1.0",
                                                 'serving.upstream_servers=["127.0.0.1:8001", "127.0.0.1:8002"]'])
    engine = BlockingEngine(config, instance_id="a0")
    settings = resolve_settings(config, instance_id="a0", host="127.0.0.1", port=8001)
    return create_app(config, engine=engine, settings=settings), engine


def keys_by_position(servers: list[str], me: str) -> tuple[str, str]:
    """(a user whose first choice is `me`, a user for whom `me` is the last try)."""
    ring = NginxConsistentHash(servers)
    first = next(f"u{i}" for i in range(1000) if ring.ranked(f"u{i}")[0] == me)
    last = next(f"u{i}" for i in range(1000) if ring.ranked(f"u{i}")[-1] == me)
    return first, last


def post_user_rank(client, user: str, routed: str | None = "affinity") -> int:
    """A rank as the cluster's nginx proxies it (routed="affinity"), or sent directly (None)."""
    hdrs = {"X-RelayGR-Affinity": user} | ({"X-RelayGR-Routed": routed} if routed else {})
    resp = client.post("/v1/rank", json=rank_body(user), headers=hdrs)
    return resp.status_code


def test_behind_nginx_the_last_instance_to_try_uses_the_last_try_budget():
    app, engine = make_member_app()  # budget 40 ms, SLO 80 ms; before any departure a rank counts 5 ms
    client = app.test_client()
    own, forwarded = keys_by_position(["127.0.0.1:8001", "127.0.0.1:8002"], "127.0.0.1:8001")
    threads = [threading.Thread(target=post_user_rank, args=(client, own)) for _ in range(8)]
    for t in threads:
        t.start()
    for _ in threads:
        assert engine.entered.acquire(timeout=30)
    assert post_user_rank(client, own) == 503  # its next instance may still serve it in time
    assert post_rank(client, rank_body(forwarded))[0] == 503  # no affinity header: no try order to be last in
    assert post_user_rank(client, forwarded, routed=None) == 503  # sent directly, not by nginx: nothing was tried
    assert post_user_rank(client, forwarded, routed="random") == 503  # nginx balancing at random: no try order
    extra = [threading.Thread(target=post_user_rank, args=(client, forwarded)) for _ in range(8)]
    for t in extra:  # 9..16 in flight x 5 ms <= 80 ms: every other instance refused these, so this one serves
        t.start()
    for _ in extra:
        assert engine.entered.acquire(timeout=30)
    assert post_user_rank(client, forwarded) == 503  # 17 x 5 ms > 80 ms: beyond the SLO it refuses too
    stats = client.get("/v1/stats").get_json()["admission"]
    assert (stats["admitted"], stats["rejected"], stats["admitted_last_resort"]) == (16, 5, 8)
    assert stats["last_resort_budget_ms"] == 80.0
    engine.release.set()
    for t in threads + extra:
        t.join(30)


def test_upstream_servers_must_name_the_instance():
    config = load_config(CONFIGS / "tiny.yaml", ['serving.upstream_servers=["127.0.0.1:8001", "127.0.0.1:8002"]'])
    settings = resolve_settings(config, port=9999)
    with pytest.raises(ConfigError, match="does not name this instance .127.0.0.1:9999"):
        create_app(config, engine=FakeEngine(config, instance_id="a0"), settings=settings)
    with pytest.raises(ConfigError, match="serving.upstream_servers"):
        load_config(CONFIGS / "tiny.yaml", ['serving.upstream_servers=["a", "a"]'])


def test_a_long_rank_weighs_more_than_a_short_one():
    app, engine = make_app(fraction=0.25)  # budget 20 ms; a predicted ms costs 1 ms before any departure
    client = app.test_client()
    results: list[int] = []
    big = rank_body("big", n=80)  # 20 ms predicted: admitted alone
    t = threading.Thread(target=lambda: results.append(post_rank(client, big)[0]))
    t.start()
    assert engine.entered.acquire(timeout=30)
    assert post_rank(client, rank_body("u1"))[0] == 503  # 20 + 5 ms > 20 ms; counted as ranks, 2 x 5 would fit
    engine.release.set()
    t.join(30)
    assert results == [200]


def test_a_cached_rank_weighs_what_the_engine_predicts_for_it():
    app, engine = make_app(fraction=0.5)
    engine.predicted_rank_ms = lambda user_id, history, candidate_ids: 2.0 if user_id == "cached" else 30.0
    client = app.test_client()
    t = threading.Thread(target=post_rank, args=(client, rank_body("slow")))
    t.start()
    assert engine.entered.acquire(timeout=30)
    assert post_rank(client, rank_body("another slow"))[0] == 503  # 30 + 30 > 40
    cached = threading.Thread(target=post_rank, args=(client, rank_body("cached")))
    cached.start()  # 30 + 2 <= 40: admitted
    assert engine.entered.acquire(timeout=30)
    assert client.get("/v1/stats").get_json()["admission"]["work"] == pytest.approx(32.0)
    engine.release.set()
    t.join(30)
    cached.join(30)


def fill_the_budget(client, engine, n: int = 8) -> list[threading.Thread]:
    """`n` ranks of 5 predicted ms in flight (the budget of make_app(0.5), before any departure: 40 ms)."""
    threads = [threading.Thread(target=post_rank, args=(client, rank_body(f"u{i}"))) for i in range(n)]
    for t in threads:
        t.start()
    for _ in threads:
        assert engine.entered.acquire(timeout=30)
    return threads


def test_a_resent_rank_is_refused_before_its_body_is_read(monkeypatch):
    app, engine = make_app(fraction=0.5)
    client = app.test_client()
    threads = fill_the_budget(client, engine)
    hdrs = {"X-RelayGR-Affinity": "again"}
    resp = client.post("/v1/rank", json=rank_body("again"), headers=hdrs)
    assert resp.status_code == 503  # read, parsed and sized: 40 + 5 > 40; its size is remembered under its key
    parsed: list[bytes] = []
    real_parse = api.schemas.parse_json
    monkeypatch.setattr(api.schemas, "parse_json", lambda data: parsed.append(data) or real_parse(data))
    for body in (json.dumps(rank_body("again")).encode(), b"{not json", b"x" * (8 * 1024 * 1024)):  # huge: > 413
        resp = client.post("/v1/rank", data=body, content_type="application/json", headers=hdrs)
        assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    assert parsed == []  # the queue alone decided: no body was parsed
    assert client.get("/v1/stats").get_json()["admission"]["rejected"] == 4
    assert post_rank(client, b"{not json")[0] == 400  # no key: the queue alone (40 ms) leaves room, so it is read
    engine.release.set()
    for t in threads:
        t.join(30)
    assert client.post("/v1/rank", json=rank_body("again"), headers=hdrs).status_code == 200


def test_refusals_do_not_move_the_unit_cost(clock, monkeypatch):
    cpu = FakeClock()  # the handler threads' CPU time: every request costs 2 ms of it
    monkeypatch.setattr(api, "cpu_clock", lambda: cpu.now, raising=False)
    real_before = api._before

    def before() -> None:
        real_before()
        cpu.advance_ms(2.0)

    app, engine = make_app(fraction=0.25)  # budget 20 ms; a predicted ms costs 1 ms before any departure
    app.before_request_funcs[None] = [before if f is real_before else f for f in app.before_request_funcs[None]]
    client = app.test_client()
    threads = fill_the_budget(client, engine, n=1)  # 5 ms in flight
    for _ in range(10):
        assert post_rank(client, rank_body("big", n=80))[0] == 503  # 5 + 20 > 20
    clock.advance_ms(30.0)  # 20 ms of it spent on the refusals, 10 on the rank
    engine.release.set()
    threads[0].join(30)
    # the rank took 10 ms for 5 predicted: 2 per unit, 1.05 after one step of 0.05 (6 per unit counting refusals)
    assert client.get("/v1/stats").get_json()["admission"]["cost_ms"] == pytest.approx(1.05)


def test_requests_parsed_at_once_are_bounded(monkeypatch):
    app, engine = make_app(fraction=0.5)
    app.extensions["relaygr"] = dataclasses.replace(app.extensions["relaygr"], parsing=threading.BoundedSemaphore(1))
    engine.release.set()
    client = app.test_client()
    inside, leave = threading.Semaphore(0), threading.Event()
    real_parse = api.schemas.parse_rank

    def slow_parse(body, limits, affinity=None):
        if body.get("user_id") == "slow":
            inside.release()
            assert leave.wait(30)
        return real_parse(body, limits, affinity)

    monkeypatch.setattr(api.schemas, "parse_rank", slow_parse)
    results: list[int] = []
    slow = threading.Thread(target=lambda: results.append(post_rank(client, rank_body("slow"))[0]))
    slow.start()
    assert inside.acquire(timeout=30)  # "slow" holds the only slot
    status, body, hdrs = post_rank(client, rank_body("other"))
    assert status == 503 and hdrs["Retry-After"] == "1" and "being parsed" in body["error"]
    pre = threading.Thread(target=lambda: results.append(
        client.post("/v1/preinfer", json=preinfer_body("p"), headers={"X-RelayGR-Affinity": "p"}).status_code))
    pre.start()  # a pre-infer is never refused for a slot: it waits
    leave.set()
    slow.join(30)
    pre.join(30)
    assert sorted(results) == [200, 202]


def test_admission_off_waits_for_a_parsing_slot(monkeypatch):
    app, engine = make_app(fraction=None)
    app.extensions["relaygr"] = dataclasses.replace(app.extensions["relaygr"], parsing=threading.BoundedSemaphore(1))
    engine.release.set()
    client = app.test_client()
    st = app.extensions["relaygr"]
    assert st.parsing.acquire(timeout=1)  # the slot is taken
    done: list[int] = []
    waiting = threading.Thread(target=lambda: done.append(post_rank(client, rank_body("w"))[0]))
    waiting.start()
    waiting.join(0.2)  # not an ordering sleep: the rank must still be waiting whatever the timing
    assert done == []
    st.parsing.release()
    waiting.join(30)
    assert done == [200]


def test_with_batched_ranks_admission_weighs_the_queue_by_the_engines_batch_share():
    """relay.max_rank_batch > 1: the queue of n ranks costs engine.queue_share(n) of its single calls, so more
    ranks fit the same budget; max_rank_batch 1 never asks."""
    config = load_config(CONFIGS / "tiny.yaml", ["trigger.slo_ms=80", "relay.admission_fraction=0.6",
                                                 "relay.max_rank_batch=4"])
    engine = BlockingEngine(config, instance_id="b0")
    asked: list[int] = []
    engine.queue_share = lambda queued: asked.append(queued) or 0.5
    app = create_app(config, engine=engine, settings=resolve_settings(config, instance_id="b0"))
    ctl = app.extensions["relaygr"].admission
    size = PREDICTED_MS_PER_EVENT * 20  # rank_body's history: 5 ms predicted
    # budget 48 ms: 9 ranks of 5 ms unbatched, 19 at half the cost
    assert sum(ctl.try_admit(size=size) for _ in range(25)) == 19
    assert asked and max(asked) == 20
    assert app.extensions["relaygr"].admission.snapshot().queue_share == 0.5

    unbatched = load_config(CONFIGS / "tiny.yaml", ["trigger.slo_ms=80", "relay.admission_fraction=0.6"])
    engine = BlockingEngine(unbatched, instance_id="b1")
    engine.queue_share = lambda queued: pytest.fail("asked without batching")
    ctl = create_app(unbatched, engine=engine, settings=resolve_settings(unbatched, instance_id="b1")).extensions[
        "relaygr"].admission
    assert sum(ctl.try_admit(size=size) for _ in range(25)) == 9
