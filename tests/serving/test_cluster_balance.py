"""nginx balancing of a cluster: affinity (consistent hash on the affinity header, the default) or
random (the no-affinity ablation), rendered, checked by `nginx -t`, and live on FakeEngine instances."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from serving import headers
from serving.cluster import BALANCES, Cluster, ClusterError, ClusterSpec, find_nginx, render_nginx_conf
from tests.conftest import CONFIGS, REPO
from tests.serving.conftest import rank_body
from tests.serving.servers import (
    FAKE_FACTORY,
    HOST,
    TIMEOUT,
    free_port_block,
    session,
    stop_cluster_process,
    wait_cluster,
)

HASH = "hash $http_x_relaygr_affinity consistent;"


def test_affinity_is_the_default_and_random_replaces_the_hash(tmp_path):
    default = render_nginx_conf(ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path))
    assert default == render_nginx_conf(ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path, balance="affinity"))
    assert HASH in default and "random;" not in default
    rand = render_nginx_conf(ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path, balance="random"))
    directives = [line.strip() for line in rand.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert "random;" in directives and not any(d.startswith("hash ") for d in directives)
    # Only the balancing line and the routing header differ; the affinity header is still logged.
    routed = 'proxy_set_header X-RelayGR-Routed "{}";'
    assert rand.replace("random;", HASH).replace(routed.format("random"), routed.format("affinity")) == default
    assert "affinity=$http_x_relaygr_affinity" in rand
    assert BALANCES == ("affinity", "random")
    with pytest.raises(ClusterError, match="balance='ring'"):
        ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path, balance="ring")


def test_random_conf_passes_nginx_t(tmp_path):
    nginx = find_nginx()
    for sub in ("logs", "tmp"):
        (tmp_path / sub).mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_nginx_conf(ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path, balance="random")))
    out = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "logs" / "e.log")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def instances_of_one_user(url: str, user: str, n: int = 20) -> Counter[str]:
    """Which instance answered each of `n` ranks of one user (same affinity header every time)."""
    s = session()
    seen: Counter[str] = Counter()
    for i in range(n):
        resp = s.post(f"{url}/v1/rank", json=rank_body(user, seed=i), headers={headers.AFFINITY: user},
                      timeout=TIMEOUT)
        assert resp.status_code == 200, resp.text
        seen[resp.headers[headers.INSTANCE]] += 1
    s.close()
    return seen


@pytest.mark.slow
def test_cli_random_balance_spreads_one_user_over_the_instances(tmp_path):
    port = free_port_block(3)
    run_dir, log = tmp_path / "cluster", tmp_path / "cluster.log"
    cmd = [sys.executable, "-m", "serving.cli", "cluster", "--instances", "2", "--port", str(port),
           "--run-dir", str(run_dir), "--config", str(CONFIGS / "tiny.yaml"), "--engine-factory", FAKE_FACTORY,
           "--balance", "random", "--ready-timeout", "120"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin"},
                                start_new_session=True)
    try:
        wait_cluster(proc, log, run_dir, port, 150)
        assert "random;" in (run_dir / "nginx.conf").read_text()
        assert "(nginx, random instance)" in log.read_text()
        seen = instances_of_one_user(f"http://{HOST}:{port}", "alice")
        assert set(seen) == {"i0", "i1"}, seen
    finally:
        stop_cluster_process(proc, run_dir)


@pytest.mark.slow
def test_set_balance_reloads_nginx_on_the_running_instances(tmp_path):
    spec = ClusterSpec(port=free_port_block(3), num_instances=2, run_dir=tmp_path / "c",
                       config_path=str(CONFIGS / "tiny.yaml"), engine_factory=FAKE_FACTORY)
    cluster = Cluster(spec)
    try:
        cluster.start(ready_timeout_s=120)
        url = f"http://{HOST}:{spec.port}"
        instance_pids = [m.pid for m in cluster.members if m.name != "nginx"]
        for user in ("alice", "bob", "carol"):
            assert len(instances_of_one_user(url, user)) == 1  # affinity: one instance per user
        cluster.set_balance("random")
        assert cluster.spec.balance == "random" and "random;" in (spec.run_dir / "nginx.conf").read_text()
        assert set(instances_of_one_user(url, "alice")) == {"i0", "i1"}
        cluster.set_balance("affinity")
        assert len(instances_of_one_user(url, "alice")) == 1
        # The instances were not restarted: same processes, still running.
        assert [m.pid for m in cluster.members if m.name != "nginx"] == instance_pids
        assert all(m.proc.poll() is None for m in cluster.members)
    finally:
        cluster.stop()
    assert not (spec.run_dir / "cluster.json").exists()
