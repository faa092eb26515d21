"""One device per instance: `relaygr cluster --device-ids` (default: instance k on device k where devices exist),
and `relaygr serve` exits with the reason when its device target is unusable, as `relaygr demo` does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mindspore_relaygr.config import load_config
from serving import cli
from serving.cluster import Cluster, ClusterError, ClusterSpec, default_device_ids
from tests.conftest import CONFIGS, REPO
from tests.serving.servers import HOST, free_port_block, stop_group


def device_of(spec: ClusterSpec, index: int) -> int:
    """The context.device_id instance `index` of `spec` is started with (its command's -o overrides)."""
    cmd = Cluster(spec).instance_command(index)
    overrides = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "-o"]
    return load_config(CONFIGS / "tiny.yaml", overrides).context.device_id


def test_each_instance_gets_its_device_id(tmp_path):
    spec = ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path, device_ids=(4, 2, 7),
                       overrides=("context.device_id=1",))  # --device-ids wins over an override of the config
    assert [device_of(spec, k) for k in range(3)] == [4, 2, 7]
    with pytest.raises(ClusterError, match="one device id per instance"):
        ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path, device_ids=(0, 1))
    with pytest.raises(ClusterError, match="device"):
        ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path, device_ids=(0, -1))


def test_by_default_instance_k_gets_device_k_where_devices_exist(tmp_path):
    ascend = load_config(CONFIGS / "tiny.yaml", ["context.device_target=Ascend"]).context
    assert default_device_ids(ascend, 3) == (0, 1, 2)
    assert default_device_ids(load_config(None, ["context.device_target=Ascend", "context.device_id=4"]).context,
                              2) == (4, 5)
    assert default_device_ids(load_config(CONFIGS / "tiny.yaml").context, 3) is None  # CPU: one host, shared
    spec = ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path)  # no ids: the config's device for all
    assert [device_of(spec, k) for k in range(2)] == [0, 0]


class Started(Exception):
    """Raised instead of starting a cluster."""


@pytest.mark.parametrize(("argv", "expected"), [
    (["--device-ids", "3,1"], (3, 1)),
    (["-o", "context.device_target=Ascend"], (0, 1)),
    ([], None),
])
def test_relaygr_cluster_device_ids(monkeypatch, tmp_path, argv, expected):
    def capture(self, *args, **kwargs):
        raise Started(self.spec)

    monkeypatch.setattr(Cluster, "start", capture)
    with pytest.raises(Started) as started:
        cli.main(["cluster", "--instances", "2", "--port", "18080", "--run-dir", str(tmp_path), *argv])
    assert started.value.args[0].device_ids == expected


def test_relaygr_cluster_refuses_a_wrong_number_of_device_ids(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(Cluster, "start", lambda self, *a, **k: pytest.fail("started"))
    assert cli.main(["cluster", "--instances", "3", "--run-dir", str(tmp_path), "--device-ids", "0,1"]) == 2
    assert "one device id per instance" in capsys.readouterr().err


@pytest.mark.slow
def test_relaygr_serve_exits_with_the_reason_when_its_device_is_unusable(tmp_path):
    """On this CPU machine no Ascend device exists: the command fails at once, naming the target (before, the
    instance came up and answered 503 for ever)."""
    port = free_port_block(1)
    log = tmp_path / "serve.log"
    cmd = [sys.executable, "-m", "serving.cli", "serve", "--host", HOST, "--port", str(port),
           "-o", "context.device_target=Ascend"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        try:
            proc.wait(120)  # a liveness bound: importing MindSpore takes seconds
        except subprocess.TimeoutExpired:
            pytest.fail(f"relaygr serve still running:\n{log.read_text()[-2000:]}")
    finally:
        stop_group(proc)
    text = log.read_text()
    assert proc.returncode == 2, text[-2000:]
    assert "context.device_target=Ascend" in text and "no usable Ascend device" in text, text[-2000:]
    assert "Booting worker" not in text  # refused before gunicorn started
