"""Several hosts: `relaygr nginx-config` writes the nginx configuration of `relaygr cluster` for instances started
elsewhere and prints the command each must run; here the "hosts" are distinct loopback addresses (127.0.0.2,
127.0.0.3), each instance started with exactly the printed command, a real nginx with exactly the printed one.
Requests through nginx reach the instance the consistent hash predicts, a refused rank (503) is served by the next
one on the ring, and admin requests are refused. FakeEngine instances, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import headers
from tests.conftest import REPO
from tests.serving.servers import FAKE_FACTORY, TIMEOUT, session, stop_group, wait_ready
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
HOSTS = ("127.0.0.2", "127.0.0.3")  # loopback: no admin token needed (serving.settings.is_loopback)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def free_port(*hosts: str) -> int:
    """A port free on every one of `hosts` right now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free on all of {hosts}")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def relaygr(*args: str) -> list[str]:
    return [sys.executable, "-m", "serving.cli", *args]


@contextlib.contextmanager
def started(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        yield proc
    finally:
        stop_group(proc)


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (scripts/run_tests.sh installs it)")
def test_nginx_config_fronts_instances_on_other_hosts(tmp_path):
    port, nginx_port = free_port(*HOSTS), free_port("127.0.0.1")
    upstreams = [f"{h}:{port}" for h in HOSTS]
    run_dir = tmp_path / "nginx"
    out = subprocess.run(relaygr("nginx-config", "--upstream", *upstreams, "--listen", f"127.0.0.1:{nginx_port}",
                                 "--run-dir", str(run_dir), "--nginx", nginx_binary(),
                                 "--serve-args", f"--config tiny --engine-factory {FAKE_FACTORY}"),
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    serve = [shlex.split(line.strip()) for line in lines if line.strip().startswith("relaygr serve")]
    start_nginx = next(shlex.split(line.split("#")[0]) for line in lines if line.strip().startswith("nginx -p"))
    assert len(serve) == 2 and "checked with nginx -t" in lines[0]
    conf = (run_dir / "nginx.conf").read_text()
    for server in upstreams:  # the template's upstream block, with the servers nginx hashes
        assert f"server {server} max_fails=0 fail_timeout=5s max_conns=64;" in conf
    assert "hash $http_x_relaygr_affinity consistent;" in conf and "proxy_next_upstream error timeout http_503" in conf
    for cmd, server in zip(serve, upstreams, strict=True):  # each instance is told the whole upstream list
        listed = f"serving.upstream_servers=[\"{upstreams[0]}\",\"{upstreams[1]}\"]"
        assert listed in cmd and server.split(":")[0] in cmd

    env = {**os.environ, "RELAYGR_FAKE_OVERLOADED": "i1"}  # i1 refuses every rank: nginx passes it on to i0
    with contextlib.ExitStack() as stack:
        for k, cmd in enumerate(serve):
            proc = stack.enter_context(started(relaygr(*cmd[1:], "--pid-file", str(tmp_path / f"i{k}.pid")),
                                               tmp_path / f"i{k}.log", env))
            wait_ready(f"http://{upstreams[k]}", proc, tmp_path / f"i{k}.log", 120)
        nginx = stack.enter_context(started([nginx_binary(), *start_nginx[1:]], tmp_path / "nginx.log", env))
        wait_until(lambda: nginx.poll() is not None or listening(nginx_port), 30, "nginx to listen")
        assert nginx.poll() is None, (tmp_path / "nginx.log").read_text()
        http = session()
        url = f"http://127.0.0.1:{nginx_port}"
        ring = NginxConsistentHash(upstreams)
        by_host = {upstreams[0]: "i0", upstreams[1]: "i1"}
        served = {}
        for u in range(24):
            user = f"user-{u}"
            body = {"user_id": user, "history": {"item_ids": [1, 2, 3], "action_ids": [0, 1, 0],
                                                 "timestamps": [1, 2, 3], "user_features": [1, 2]},
                    "candidates": {"item_ids": [4, 5]}}
            pre = http.post(f"{url}/v1/preinfer", json={k: body[k] for k in ("user_id", "history")},
                            headers={headers.AFFINITY: user}, timeout=TIMEOUT)
            # a pre-infer is never refused: it lands where the hash says
            assert pre.status_code == 202 and pre.json()["instance"] == by_host[ring.ranked(user)[0]], pre.text
            rank = http.post(f"{url}/v1/rank", json=body, headers={headers.AFFINITY: user}, timeout=TIMEOUT)
            assert rank.status_code == 200, rank.text
            served[user] = rank.json()["instance"]
        assert set(served.values()) == {"i0"}  # every rank i1 refused was served by i0, the next on the ring
        assert any(by_host[ring.ranked(u)[0]] == "i1" for u in served)  # ... and some were i1's users
        admin = http.post(f"{url}/v1/admin/flush", timeout=TIMEOUT)
        assert admin.status_code == 403 and admin.json()["field"] is None
