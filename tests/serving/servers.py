"""Live servers for the slow serving tests: gunicorn instances and clusters on 127.0.0.1, stopped by PID.

Every process is started in its own session (process group = its PID) and stopped with that group
in a `finally`, even when the test fails. HTTP goes through a `requests.Session` that ignores proxy
variables, with timeouts on every call.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from serving.cluster import live_processes
from tests.conftest import REPO
from tests.waiting import wait_until

FAKE_FACTORY = "tests.serving.fake_engine:FakeEngine.from_config"
HOST = "127.0.0.1"
TIMEOUT = (2, 60)  # (connect, read) seconds of every request


def session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # loopback only: never an HTTP(S)_PROXY from the environment
    return s


def free_port_block(n: int) -> int:
    """A base port such that base..base+n-1 are all free on 127.0.0.1 right now."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind((HOST, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports")


def stop_group(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """SIGTERM the process group we started (leader = proc.pid), then SIGKILL if needed."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # A gunicorn worker whose master was killed exits by itself; make sure nothing of the group is left.
    # While any member lives, the kernel does not reuse the leader's PID, so this group is still ours.
    if group_members(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def group_members(pgid: int) -> list[int]:
    """PIDs (zombies excluded) whose process group is `pgid`."""
    return live_processes(group=pgid)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Poll `url`/readyz until 200; fail with the log tail if the process exits or time runs out."""
    s = session()
    last: list[object] = [None]

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode} before it was ready:\n{tail(log)}")
        try:
            resp = s.get(f"{url}/readyz", timeout=2)
        except requests.RequestException as exc:
            last[0] = exc
            return False
        if resp.status_code == 200:
            return True
        last[0] = resp.json()
        if last[0].get("status") == "failed":
            pytest.fail(f"engine start-up failed: {last[0].get('error')}\n{tail(log)}")
        return False

    try:
        wait_until(ready, timeout, f"{url} to be ready", poll_s=0.2)
    except AssertionError:
        pytest.fail(f"{url} not ready after {timeout:.0f} s (last: {last[0]}):\n{tail(log)}")


@contextlib.contextmanager
def serve(tmp: Path, instance_id: str = "s0", config: Path | None = None, overrides: tuple[str, ...] = (),
          engine_factory: str | None = None, env: dict[str, str] | None = None,
          ready_timeout: float = 600.0, bundle: Path | None = None) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    """`relaygr serve` (via python -m) on a free port; yields (base url, process, log path)."""
    port = free_port_block(1)
    log = tmp / f"{instance_id}.log"
    cmd = [sys.executable, "-m", "serving.cli", "serve", "--host", HOST, "--port", str(port),
           "--instance-id", instance_id, "--pid-file", str(tmp / f"{instance_id}.pid")]
    if config is not None:
        cmd += ["--config", str(config)]
    if bundle is not None:
        cmd += ["--bundle", str(bundle)]
    for o in overrides:
        cmd += ["-o", o]
    if engine_factory:
        cmd += ["--engine-factory", engine_factory]
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        url = f"http://{HOST}:{port}"
        wait_ready(url, proc, log, ready_timeout)
        yield url, proc, log
    finally:
        stop_group(proc)


@contextlib.contextmanager
def cluster(tmp: Path, num_instances: int, config: Path | None = None, overrides: tuple[str, ...] = (),
            engine_factory: str | None = None, env: dict[str, str] | None = None,
            ready_timeout: float = 900.0, extra_args: tuple[str, ...] = ()
            ) -> Iterator[tuple[str, subprocess.Popen, Path, int]]:
    """`relaygr cluster` (plus `extra_args`) in the foreground; yields (nginx url, cluster process, run dir,
    nginx port)."""
    port = free_port_block(num_instances + 1)
    run_dir = tmp / "cluster"
    log = tmp / "cluster.log"
    cmd = [sys.executable, "-m", "serving.cli", "-v", "cluster", "--instances",
           str(num_instances), "--port", str(port), "--run-dir", str(run_dir), "--ready-timeout", str(ready_timeout),
           "--fail-timeout", "30"]
    if config is not None:
        cmd += ["--config", str(config)]
    for o in overrides:
        cmd += ["-o", o]
    if engine_factory:
        cmd += ["--engine-factory", engine_factory]
    cmd += list(extra_args)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PATH": os.environ.get("PATH", "") + ":/usr/sbin",
                                     "RELAYGR_CLUSTER_REGISTRY": str(tmp / "registry"), **(env or {})},
                                start_new_session=True)
    try:
        wait_cluster(proc, log, run_dir, port, ready_timeout + 30)
        yield f"http://{HOST}:{port}", proc, run_dir, port
    finally:
        stop_cluster_process(proc, run_dir)


def wait_cluster(proc: subprocess.Popen, log: Path, run_dir: Path, port: int, timeout: float) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"relaygr cluster exited with {proc.returncode}:\n{tail(log)}")
        return "[cluster] ready" in log.read_text(errors="replace")

    try:
        wait_until(ready, timeout, "the cluster to be ready", poll_s=0.2)
    except AssertionError:
        pytest.fail(f"cluster not ready after {timeout:.0f} s:\n{tail(log)}")


def stop_cluster_process(proc: subprocess.Popen, run_dir: Path) -> None:
    """SIGTERM the cluster command (it stops nginx and the instances); then make sure by PID."""
    from serving.cluster import read_state, stop_members

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if (run_dir / "cluster.json").exists():  # the command could not clean up: stop its members ourselves
        stop_members(read_state(run_dir), run_dir.resolve(), 20)
    stop_group(proc)
