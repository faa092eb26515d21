"""Real RelayEngine behind real gunicorn and nginx (configs/tiny.yaml): the end-to-end serving claims.

Scores are compared with an in-process RelayEngine that has the relay disabled (full inference).
The overrides make every pre-infer of the (fast) tiny model "at risk", so relays are admitted.
If `mindspore_relaygr.relay.engine` cannot be imported, every test here fails saying so.
"""

from __future__ import annotations

import importlib
import os
import signal

import numpy as np
import pytest

from mindspore_relaygr.config import load_config
from mindspore_relaygr.relay.router import NginxConsistentHash
from mindspore_relaygr.relay.types import CACHE_TIERS
from serving import headers
from serving.cluster import read_state
from serving.schemas import Limits
from tests.conftest import CONFIGS, ONE_BUCKET, random_history
from tests.serving.fuzz import EXPECTED_STATUSES, HostileRequests
from tests.serving.servers import TIMEOUT, cluster, serve, session
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
TINY = CONFIGS / "tiny.yaml"
TOL = 1e-5
# Every pre-infer is "at risk" (budget slo_ms * 1e-9), ranks wait for a running prefill, entries stay for 10 min.
RELAY = ("trigger.risk_margin=0.000000001", "relay.inflight_wait_ms=10000", "cache.lifetime_ms=600000",
         "cache.num_slots=8")
SERVER = (*RELAY, "context.num_threads=1")  # several instances share two cores


@pytest.fixture(scope="module")
def fast_start(tmp_path_factory):
    """Instances start in seconds: a fixed latency profile, graphs compiled on first use, one shape bucket per axis.

    (Warm-up and calibration are covered by the engine tests; here the HTTP story is under test.)
    """
    from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint

    path = tmp_path_factory.mktemp("profile") / "latency.json"
    LatencyModel([LatencyPoint("full", 128, 32, 0, 50.0), LatencyPoint("relay", 128, 16, 32, 5.0),
                  LatencyPoint("prefill", 128, 0, 0, 20.0)]).to_json(path)
    return (f"trigger.latency_profile={path}", "relay.warmup=false", *ONE_BUCKET)


@pytest.fixture(scope="module")
def reference(fast_start):
    """RelayEngine with relay.enabled=false: what every rank must equal (to TOL)."""
    try:
        engine_module = importlib.import_module("mindspore_relaygr.relay.engine")
    except ImportError as exc:
        pytest.fail(f"mindspore_relaygr.relay.engine is not importable ({exc}); the serving integration tests "
                    "need RelayEngine.from_config (relay-engine issue)")
    engine = engine_module.RelayEngine.from_config(load_config(TINY, ["relay.enabled=false", *fast_start]),
                                                   instance_id="ref")
    yield engine
    engine.close()


def history(seed: int, n: int) -> dict[str, list[int]]:
    hist = random_history(np.random.default_rng(seed), n, user_features=[1, 2])
    return {k: np.asarray(v).tolist() for k, v in hist.items()}


def candidates(seed: int, m: int = 20) -> list[int]:
    return np.random.default_rng(seed + 10_000).choice(np.arange(1, 201), size=m, replace=False).tolist()


def check_scores(resp, reference, user, hist, cands):
    want = reference.rank(user, hist, cands).scores
    np.testing.assert_allclose(np.asarray(resp.json()["scores"], np.float32), want, atol=TOL, rtol=0)


def wait_cached(s, url, user, hist, timeout=120.0):
    """Re-send the pre-infer until the instance reports the prefix cached (the prefill finished)."""
    def cached() -> bool:
        resp = s.post(f"{url}/v1/preinfer", json={"user_id": user, "history": hist},
                      headers={headers.AFFINITY: user}, timeout=TIMEOUT)
        assert resp.json()["reason"] in ("already_cached", "inflight"), resp.json()
        return resp.json()["reason"] == "already_cached"

    wait_until(cached, timeout, f"the prefill of {user} to finish", poll_s=0.05)


def test_preinfer_then_rank_is_served_from_the_device_with_full_inference_scores(tmp_path, reference, fast_start):
    with serve(tmp_path, "e0", config=TINY, overrides=(*SERVER, *fast_start)) as (url, proc, log):
        s = session()
        hdr = {headers.AFFINITY: "alice"}
        hist, cands = history(1, 100), candidates(1)
        pre = s.post(f"{url}/v1/preinfer", json={"user_id": "alice", "history": hist, "num_candidates": 20},
                     headers=hdr, timeout=TIMEOUT)
        assert pre.status_code == 202 and pre.json()["admitted"] and pre.json()["reason"] == "admitted", pre.text
        wait_cached(s, url, "alice", hist)
        rank = s.post(f"{url}/v1/rank", json={"user_id": "alice", "history": hist, "candidates": {"item_ids": cands},
                                             "top_k": 5}, headers=hdr, timeout=TIMEOUT)
        assert rank.status_code == 200 and rank.headers[headers.CACHE] == "device", rank.text
        assert rank.headers[headers.INSTANCE] == "e0" and len(rank.json()["ranking"]) == 5
        check_scores(rank, reference, "alice", hist, cands)

        # The ranking request carries a few short-term events that happened after the pre-infer.
        later = {**history(2, 4), "timestamps": [hist["timestamps"][-1] + 60 * k for k in range(1, 5)]}
        longer = {k: (v if k == "user_features" else v + later[k]) for k, v in hist.items()}
        wait_cached(s, url, "alice", hist)
        rank = s.post(f"{url}/v1/rank", json={"user_id": "alice", "history": longer,
                                             "candidates": {"item_ids": cands}}, headers=hdr, timeout=TIMEOUT)
        assert rank.status_code == 200 and rank.headers[headers.CACHE] in ("device", "partial"), rank.text
        check_scores(rank, reference, "alice", longer, cands)

        miss = s.post(f"{url}/v1/rank", json={"user_id": "bob", "history": history(3, 60),
                                             "candidates": {"item_ids": cands}}, timeout=TIMEOUT)
        assert miss.status_code == 200 and miss.headers[headers.CACHE] == "miss"
        check_scores(miss, reference, "bob", history(3, 60), cands)
        stats = s.get(f"{url}/v1/stats", timeout=TIMEOUT).json()
        assert stats["ready"] and stats["instance"] == "e0" and stats["engine"] is not None
        metrics = s.get(f"{url}/metrics", timeout=TIMEOUT).text
        assert 'relaygr_rank_requests_total{cache="miss"} 1.0' in metrics
        assert 'relaygr_trigger_decisions_total{reason="admitted"} 1.0' in metrics


def test_live_instance_survives_hostile_traffic_and_keeps_the_known_users_cache(tmp_path, reference, fast_start):
    config = load_config(TINY, list(SERVER))
    with serve(tmp_path, "f0", config=TINY, overrides=(*SERVER, *fast_start)) as (url, proc, log):
        s = session()
        hist, cands = history(5, 90), candidates(5)
        assert s.post(f"{url}/v1/preinfer", json={"user_id": "known", "history": hist},
                      headers={headers.AFFINITY: "known"}, timeout=TIMEOUT).json()[
            "admitted"]
        wait_cached(s, url, "known", hist)
        worker = s.get(f"{url}/healthz", timeout=TIMEOUT).json()["pid"]
        probes = HostileRequests(seed=7, limits=Limits.from_config(config), known_user="known",
                                 max_body=4 * 1024 * 1024).probes(300)
        for probe in probes:
            resp = s.request(probe.method, url + probe.path, data=probe.body, headers=probe.headers, timeout=TIMEOUT)
            assert resp.status_code in EXPECTED_STATUSES, (probe.what, resp.status_code, resp.text[:300])
        health = s.get(f"{url}/healthz", timeout=TIMEOUT)
        assert health.status_code == 200 and health.json()["pid"] == worker  # the worker never died
        assert s.get(f"{url}/readyz", timeout=TIMEOUT).status_code == 200
        rank = s.post(f"{url}/v1/rank", json={"user_id": "known", "history": hist, "candidates": {"item_ids": cands}},
                      timeout=TIMEOUT)
        assert rank.status_code == 200 and rank.headers[headers.CACHE] == "device", rank.text
        check_scores(rank, reference, "known", hist, cands)


def test_nginx_keeps_each_user_on_one_instance_and_survives_a_killed_instance(tmp_path, reference, fast_start):
    with cluster(tmp_path, 3, config=TINY, overrides=(*SERVER, *fast_start)) as (url, proc, run_dir, port):
        members = {f"127.0.0.1:{m.port}": (m.name, m.pid) for m in read_state(run_dir) if m.name != "nginx"}
        ring = NginxConsistentHash(list(members))
        s = session()
        users = {f"user-{i}": (history(100 + i, 40 + i), candidates(100 + i)) for i in range(50)}
        for user, (hist, cands) in users.items():
            hdr = {headers.AFFINITY: user}
            pre = s.post(f"{url}/v1/preinfer", json={"user_id": user, "history": hist}, headers=hdr, timeout=TIMEOUT)
            rank = s.post(f"{url}/v1/rank", json={"user_id": user, "history": hist, "candidates": {"item_ids": cands}},
                          headers=hdr, timeout=TIMEOUT)
            assert pre.status_code == 202 and pre.json()["admitted"], (user, pre.text)
            assert rank.status_code == 200, (user, rank.text)
            owner = members[ring.route(user)][0]
            assert pre.headers[headers.INSTANCE] == rank.headers[headers.INSTANCE] == owner, user
            assert rank.headers[headers.CACHE] in ("device", "inflight"), (user, rank.headers[headers.CACHE])
            check_scores(rank, reference, user, hist, cands)
        assert len({members[ring.route(u)][0] for u in users}) == 3

        dead = next(server for server, (name, _) in members.items() if name == "i1")
        for i, (user, (hist, cands)) in enumerate(users.items()):
            if i == 25:  # mid-stream: kill instance i1 (gunicorn master and worker)
                os.killpg(members[dead][1], signal.SIGKILL)
            rank = s.post(f"{url}/v1/rank", json={"user_id": user, "history": hist, "candidates": {"item_ids": cands}},
                          headers={headers.AFFINITY: user}, timeout=TIMEOUT)
            assert rank.status_code == 200, (user, rank.text)
            down = {dead} if i >= 25 else set()
            assert rank.headers[headers.INSTANCE] == members[ring.route(user, down=down)][0], user
            assert rank.headers[headers.CACHE] in CACHE_TIERS
            if i >= 25 and ring.route(user) == dead:
                assert rank.headers[headers.CACHE] == "miss", user  # recomputed on the next instance
            check_scores(rank, reference, user, hist, cands)
