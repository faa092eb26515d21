"""`ClusterSpec.pin_cpus` (`relaygr cluster --pin-cpus`): one core per instance, as one device per instance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from serving.cluster import Cluster, ClusterSpec
from serving.settings import ENV_OVERRIDES
from tests.conftest import CONFIGS
from tests.serving.servers import FAKE_FACTORY, HOST, free_port_block, session


def allowed_cpus(pid: int) -> set[int]:
    """The CPU affinity of a process, from /proc (the kernel's list form, e.g. "0-1,3")."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Cpus_allowed_list"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def children(pid: int) -> list[int]:
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        kids += [int(k) for k in text]
    return kids


def test_instance_k_gets_the_kth_usable_core():
    cores = sorted(os.sched_getaffinity(0))
    spec = ClusterSpec(port=18000, num_instances=4, run_dir=Path("unused"), pin_cpus=True)
    assert [spec.cpu_set(k) for k in range(4)] == [{cores[k % len(cores)]} for k in range(4)]
    assert ClusterSpec(port=18000, num_instances=2, run_dir=Path("unused")).cpu_set(0) is None


@pytest.mark.slow
def test_pinned_instances_and_their_workers_run_on_their_core(tmp_path):
    spec = ClusterSpec(port=free_port_block(3), num_instances=2, run_dir=tmp_path / "c",
                       config_path=str(CONFIGS / "tiny.yaml"), engine_factory=FAKE_FACTORY, pin_cpus=True)
    cluster = Cluster(spec)
    try:
        cluster.start(ready_timeout_s=120)
        for k, member in enumerate(m for m in cluster.members if m.name != "nginx"):
            expected = spec.cpu_set(k)
            workers = children(member.pid)
            assert workers, f"{member.name}: no gunicorn worker"
            for pid in [member.pid, *workers]:
                assert allowed_cpus(pid) == expected, (member.name, pid)
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{member.pid}/environ").read_text().split("\0") if kv)
            assert "context.num_threads=1" in json.loads(env[ENV_OVERRIDES])  # one MindSpore thread per core
        nginx = next(m for m in cluster.members if m.name == "nginx")
        assert allowed_cpus(nginx.pid) == os.sched_getaffinity(0)  # the proxy is not pinned
        with session() as http:  # and the pinned cluster serves
            assert http.get(f"http://{HOST}:{spec.port}/readyz", timeout=10).status_code == 200
    finally:
        cluster.stop()
