"""Real gunicorn instances and a real nginx, with the numpy FakeEngine inside (no MindSpore).

They prove the process story (exec'd gunicorn master, one worker, PID files, SIGTERM), nginx's
affinity against the Python port, fail-over on a dead or overloaded instance, and stop-by-PID.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from mindspore_relaygr.model.inputs import validate_candidates, validate_history
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import headers
from serving.cluster import read_state
from tests.conftest import REPO
from tests.serving.conftest import KNOWN_USER, preinfer_body, rank_body
from tests.serving.fake_engine import fake_scores
from tests.serving.fuzz import EXPECTED_STATUSES, HostileRequests
from tests.serving.servers import FAKE_FACTORY, HOST, TIMEOUT, cluster, group_members, serve, session
from tests.waiting import wait_until

pytestmark = pytest.mark.slow


def test_serve_execs_gunicorn_with_one_worker_and_stops_on_sigterm(tmp_path):
    with serve(tmp_path, "s0", engine_factory=FAKE_FACTORY) as (url, proc, log):
        s = session()
        assert int((tmp_path / "s0.pid").read_text()) == proc.pid  # `relaygr serve` became the master
        stats = s.get(f"{url}/v1/stats", timeout=TIMEOUT).json()
        worker = stats["pid"]
        assert worker != proc.pid and sorted(group_members(proc.pid)) == sorted([proc.pid, worker])
        resp = s.post(f"{url}/v1/preinfer", json=preinfer_body(), headers={headers.AFFINITY: KNOWN_USER},
                      timeout=TIMEOUT)
        assert resp.status_code == 202 and resp.headers[headers.INSTANCE] == "s0"
        resp = s.post(f"{url}/v1/rank", json=rank_body(), timeout=TIMEOUT)
        assert resp.status_code == 200 and resp.headers[headers.CACHE] == "device"
        assert "relaygr_engine_ready 1.0" in s.get(f"{url}/metrics", timeout=TIMEOUT).text
        big = s.post(f"{url}/v1/rank", data=b'{"pad": "' + b"x" * (4 * 1024 * 1024) + b'"}',
                     headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
        assert big.status_code == 413 and big.json()["field"] == "body"
        assert s.get(f"{url}/healthz", timeout=TIMEOUT).json()["pid"] == worker  # same worker throughout
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not group_members(proc.pid)
        assert "worker" in log.read_text() and "building the engine" in log.read_text()


def test_a_kept_alive_connection_survives_rejected_bodies(tmp_path):
    """gunicorn closes a connection whose unread body exceeds 64 KiB; the app drains it instead (a body with a
    Content-Length, or a chunked one within serving.max_content_length)."""
    with serve(tmp_path, "k0", engine_factory=FAKE_FACTORY) as (url, proc, log):
        conn = http.client.HTTPConnection(*url.removeprefix("http://").split(":"), timeout=30)
        try:
            for method, path, body, status in [
                ("POST", "/v1/rank", b'{"pad": "' + b"x" * (4 * 1024 * 1024) + b'"}', 413),
                ("POST", "/nope", b"y" * 300_000, 404),
                ("PUT", "/v1/rank", b"z" * 300_000, 405),
                ("GET", "/healthz", b"w" * 300_000, 200),
                ("POST", "/v1/rank", b"{" + b" " * 300_000, 400),
            ]:
                # Chunks announcing more than the limit are refused at their size line and the connection
                # closed, as nginx does (tests/serving/test_http_edges.py): only a sized oversized body is drained.
                for chunked in (False,) if status == 413 else (False, True):
                    data = iter([body[:1000], body[1000:]]) if chunked else body
                    conn.request(method, path, body=data, headers={"Content-Type": "application/json"},
                                 encode_chunked=chunked)
                    resp = conn.getresponse()
                    assert resp.status == status and json.loads(resp.read()), (method, path, chunked)
                conn.request("GET", "/healthz")  # same connection
                again = conn.getresponse()
                assert again.status == 200 and again.getheader("Connection") == "keep-alive", (method, path)
                again.read()
        finally:
            conn.close()


def test_serve_rejects_a_bad_config_before_starting(tmp_path):
    out = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--port", "1",
                          "-o", "cache.num_slots=-1"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cache.num_slots=-1" in out.stderr


def test_live_instance_survives_hostile_traffic(tmp_path, tiny_config):
    from serving.schemas import Limits

    with serve(tmp_path, "z0", engine_factory=FAKE_FACTORY) as (url, proc, log):
        s = session()
        assert s.post(f"{url}/v1/preinfer", json=preinfer_body(), headers={headers.AFFINITY: KNOWN_USER},
                      timeout=TIMEOUT).json()["admitted"]
        worker = s.get(f"{url}/healthz", timeout=TIMEOUT).json()["pid"]
        probes = HostileRequests(seed=99, limits=Limits.from_config(tiny_config), known_user=KNOWN_USER,
                                 max_body=4 * 1024 * 1024).probes(250)
        for probe in probes:
            resp = s.request(probe.method, url + probe.path, data=probe.body, headers=probe.headers, timeout=TIMEOUT)
            assert resp.status_code in EXPECTED_STATUSES, (probe.what, resp.status_code, resp.text[:300])
            assert resp.headers["Content-Type"] == "application/json", probe.what
        health = s.get(f"{url}/healthz", timeout=TIMEOUT)
        assert health.status_code == 200 and health.json()["pid"] == worker  # the worker never died
        resp = s.post(f"{url}/v1/rank", json=rank_body(), timeout=TIMEOUT)
        assert resp.status_code == 200 and resp.headers[headers.CACHE] == "device"
        assert "Traceback" not in log.read_text()


def _instances(run_dir):
    """server string -> (instance id, pid) from the cluster's state file."""
    return {f"127.0.0.1:{m.port}": (m.name, m.pid) for m in read_state(run_dir) if m.name != "nginx"}


def test_cluster_affinity_matches_the_python_port_and_survives_a_dead_instance(tmp_path, tiny_config):
    with cluster(tmp_path, 3, engine_factory=FAKE_FACTORY) as (url, proc, run_dir, port):
        members = _instances(run_dir)
        ring = NginxConsistentHash(list(members))
        s = session()
        users = [f"user-{i}" for i in range(50)]
        for user in users:
            hdr = {headers.AFFINITY: user}
            pre = s.post(f"{url}/v1/preinfer", json=preinfer_body(user, seed=len(user)), headers=hdr, timeout=TIMEOUT)
            rank = s.post(f"{url}/v1/rank", json=rank_body(user, seed=len(user)), headers=hdr, timeout=TIMEOUT)
            assert pre.status_code == 202 and rank.status_code == 200
            expected = members[ring.route(user)][0]
            assert pre.headers[headers.INSTANCE] == rank.headers[headers.INSTANCE] == expected, user
            assert rank.headers[headers.CACHE] == "device", user
        assert len({members[ring.route(u)][0] for u in users}) == 3  # every instance owns some users

        dead_server = next(srv for srv, (name, _) in members.items() if name == "i1")
        for i, user in enumerate(users):
            if i == 20:  # mid-stream: kill instance i1 (master and worker) by its process group
                os.killpg(members[dead_server][1], signal.SIGKILL)
            body = rank_body(user, seed=len(user), candidates=list(range(5, 25)))
            resp = s.post(f"{url}/v1/rank", json=body, headers={headers.AFFINITY: user}, timeout=TIMEOUT)
            assert resp.status_code == 200, (user, resp.text[:300])
            down = {dead_server} if i >= 20 else set()
            assert resp.headers[headers.INSTANCE] == members[ring.route(user, down=down)][0], user
            hist = validate_history(tiny_config.model, body["history"])
            want = fake_scores(hist, validate_candidates(tiny_config.model, body["candidates"]["item_ids"]), 2)
            np.testing.assert_array_equal(np.asarray(resp.json()["scores"], np.float32), want)
            moved = i >= 20 and ring.route(user) == dead_server
            assert resp.headers[headers.CACHE] == ("miss" if moved else "device"), user

        stop = subprocess.run([sys.executable, "-m", "serving.cli", "cluster", "--stop",
                               "--run-dir", str(run_dir)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0, stop.stderr
        assert "nginx" in stop.stderr and "i0" in stop.stderr
        assert proc.wait(30) == 0  # the foreground command noticed nginx stopped and exits
        assert not any(group_members(pid) for _, pid in members.values())
        assert not (run_dir / "cluster.json").exists()


def test_cluster_passes_ranks_from_an_overloaded_instance_on_and_ctrl_c_stops_it(tmp_path):
    env = {"RELAYGR_FAKE_OVERLOADED": "i0"}
    with cluster(tmp_path, 2, engine_factory=FAKE_FACTORY, env=env) as (url, proc, run_dir, port):
        members = _instances(run_dir)
        ring = NginxConsistentHash(list(members))
        overloaded = next(srv for srv, (name, _) in members.items() if name == "i0")
        s = session()
        users = [u for u in (f"u{i}" for i in range(40)) if ring.route(u) == overloaded][:10]
        assert users
        for user in users:
            resp = s.post(f"{url}/v1/rank", json=rank_body(user), headers={headers.AFFINITY: user}, timeout=TIMEOUT)
            assert resp.status_code == 200 and resp.headers[headers.INSTANCE] == "i1", user
            assert resp.headers[headers.CACHE] == "miss"
        metrics = s.get(f"http://{overloaded}/metrics", timeout=TIMEOUT).text
        assert 'relaygr_rejections_total{endpoint="/v1/rank",reason="overloaded"}' in metrics
        for server in members:  # the cluster told each instance its upstream block: last tries get the whole SLO
            admission = s.get(f"http://{server}/v1/stats", timeout=TIMEOUT).json()["admission"]
            assert admission["last_resort_budget_ms"] > admission["budget_ms"], admission
        # Errors nginx produces itself keep the API's JSON shape.
        big = s.post(f"{url}/v1/rank", data=b"x" * (4 * 1024 * 1024 + 10), timeout=TIMEOUT)
        assert big.status_code == 413 and big.json()["field"] == "body"

        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(60) == 0
        assert not any(group_members(pid) for _, pid in members.values())
        wait_until(lambda: not (run_dir / "cluster.json").exists(), what="the cluster to remove its state file")


def test_a_detached_cluster_stops_by_port_from_any_directory(tmp_path):
    with cluster(tmp_path, 1, engine_factory=FAKE_FACTORY) as (url, proc, run_dir, port):
        members = _instances(run_dir)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        env = {**os.environ, "RELAYGR_CLUSTER_REGISTRY": str(tmp_path / "registry"),
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        stop = subprocess.run([sys.executable, "-m", "serving.cli", "cluster", "--stop", "--port", str(port)],
                              cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0 and "nginx" in stop.stderr and "i0" in stop.stderr, stop.stderr
        assert proc.wait(30) == 0
        assert not any(group_members(pid) for _, pid in members.values())
        assert not (tmp_path / "registry" / f"{port}.json").exists()  # the record goes with the cluster


def test_cluster_refuses_a_busy_run_dir_and_reports_a_missing_one(tmp_path):
    with cluster(tmp_path, 1, engine_factory=FAKE_FACTORY) as (url, proc, run_dir, port):
        again = subprocess.run([sys.executable, "-m", "serving.cli", "cluster", "--instances", "1",
                                "--port", str(port + 10), "--run-dir", str(run_dir),
                                "--engine-factory", FAKE_FACTORY], cwd=REPO, capture_output=True, text=True,
                               timeout=120)
        assert again.returncode == 2 and "already runs a cluster" in again.stderr
        assert session().get(f"{url}/healthz", timeout=TIMEOUT).status_code == 200  # untouched
    missing = subprocess.run([sys.executable, "-m", "serving.cli", "cluster", "--stop", "--run-dir",
                              str(tmp_path / "nope")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no cluster was started" in missing.stderr



@pytest.mark.slow
def test_a_rank_refused_before_its_body_is_read_keeps_the_connection_alive(tmp_path):
    """With a rank in flight that alone is over the admission budget, ranks are refused before Flask parses
    them; their bodies (one over gunicorn's 64 KiB drain) are drained, so one kept-alive connection carries
    every refusal and the next request."""
    import threading

    env = {"RELAYGR_FAKE_RANK_MS": "3000"}  # predicted and served in 3 s: over the 30 ms budget by itself
    with serve(tmp_path, engine_factory=FAKE_FACTORY, env=env) as (url, _, log):
        s = session()
        holder = threading.Thread(target=lambda: s.post(f"{url}/v1/rank", json=rank_body("holder"), timeout=TIMEOUT))
        holder.start()
        wait_until(lambda: session().get(f"{url}/v1/stats", timeout=TIMEOUT).json()["admission"]["in_flight"],
                   timeout_s=30, what="the holder's rank to be admitted")
        conn = http.client.HTTPConnection(HOST, int(url.rsplit(":", 1)[1]), timeout=TIMEOUT[1])
        sockets = []
        for body in (json.dumps(rank_body("r")).encode(), b"{not json", b"x" * 100_000):
            conn.request("POST", "/v1/rank", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            assert resp.status == 503 and resp.getheader("Retry-After") == "1"
            assert resp.getheader(headers.INSTANCE) == "s0"
            assert doc["field"] is None and "overloaded" in doc["error"]
            sockets.append(conn.sock)
        holder.join(TIMEOUT[1])
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
        sockets.append(conn.sock)
        assert all(sock is sockets[0] for sock in sockets)  # never reconnected
        assert 'relaygr_rejections_total{endpoint="/v1/rank",reason="overloaded"} 3.0' in metrics
        assert 'relaygr_http_requests_total{endpoint="/v1/rank",method="POST",status="503"} 3.0' in metrics
