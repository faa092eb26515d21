"""The admin endpoint is never open to the network: an instance bound to a non-loopback address starts only
with an admin token, and a cluster's nginx does not forward /v1/admin/ at all (flush each instance directly).
/metrics and /v1/stats stay readable without a token."""

from __future__ import annotations

import json

import pytest

from mindspore_relaygr.errors import ConfigError
from serving import cli, headers
from serving.app import create_app
from serving.settings import is_loopback, require_admin_token, resolve_settings
from tests.serving.conftest import KNOWN_USER, FakeEngine, preinfer_body
from tests.serving.servers import FAKE_FACTORY, cluster, session
from tests.serving.test_error_shape import assert_json_error, exchange

TOKEN = "a-long-admin-token"


class Exec(Exception):
    """Raised instead of exec'ing gunicorn: nothing binds in these tests."""


@pytest.fixture
def no_exec(monkeypatch):
    def fake_execve(path, argv, env):
        raise Exec({k: v for k, v in env.items() if k.startswith("RELAYGR_")})

    monkeypatch.setattr(cli.os, "execve", fake_execve)
    monkeypatch.delenv("RELAYGR_ADMIN_TOKEN", raising=False)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.7", False), ("relaygr.internal", False),
])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


def test_a_non_loopback_instance_needs_a_token(tiny_config):
    exposed = resolve_settings(tiny_config, host="0.0.0.0")
    with pytest.raises(ConfigError, match="RELAYGR_ADMIN_TOKEN") as err:
        require_admin_token(exposed)
    assert "serving.admin_token" in str(err.value) and "0.0.0.0" in str(err.value)
    with pytest.raises(ConfigError, match="admin token"):
        create_app(tiny_config, engine=FakeEngine(tiny_config), settings=exposed)
    require_admin_token(resolve_settings(tiny_config, host="0.0.0.0", admin_token=TOKEN))
    require_admin_token(resolve_settings(tiny_config))  # 127.0.0.1: no token needed


def test_relaygr_serve_refuses_to_bind_0000_without_a_token(no_exec, capsys):
    argv = ["serve", "--host", "0.0.0.0", "--port", "8080", "--engine-factory", FAKE_FACTORY]
    assert cli.main(argv) == 2
    assert "RELAYGR_ADMIN_TOKEN" in capsys.readouterr().err


def test_relaygr_serve_takes_the_token_from_the_environment(no_exec, monkeypatch):
    monkeypatch.setenv("RELAYGR_ADMIN_TOKEN", TOKEN)
    with pytest.raises(Exec) as started:
        cli.main(["serve", "--host", "0.0.0.0", "--port", "8080", "--engine-factory", FAKE_FACTORY])
    assert started.value.args[0]["RELAYGR_ADMIN_TOKEN"] == TOKEN


def test_relaygr_cluster_refuses_a_non_loopback_host_without_a_token(no_exec, monkeypatch, tmp_path, capsys):
    from serving import cluster as cluster_module

    def no_start(self, *args, **kwargs):
        raise Exec("the cluster started")

    monkeypatch.setattr(cluster_module.Cluster, "start", no_start)
    argv = ["cluster", "--host", "0.0.0.0", "--port", "18080", "--run-dir", str(tmp_path), "--engine-factory",
            FAKE_FACTORY]
    assert cli.main(argv) == 2
    assert "RELAYGR_ADMIN_TOKEN" in capsys.readouterr().err


@pytest.mark.slow
def test_nginx_does_not_forward_admin_requests(tmp_path):
    with cluster(tmp_path, 1, engine_factory=FAKE_FACTORY) as (url, proc, run_dir, port):
        s = session()
        affinity = {headers.AFFINITY: KNOWN_USER}
        assert s.post(f"{url}/v1/preinfer", json=preinfer_body(), headers=affinity, timeout=30).status_code == 202
        for path in (b"/v1/admin/flush", b"/v1//admin/flush", b"/v1/%61dmin/flush", b"/v1/admin"):
            refused = exchange(port, b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path)
            doc = assert_json_error(refused, 403)
            assert "each instance" in doc["error"] and headers.INSTANCE.lower() not in refused[1], path
        stats = s.get(f"{url}/v1/stats", timeout=30).json()  # still readable through nginx, as /metrics is
        assert stats["engine"]["cache"]["device"]["num_ready"] == 1  # nothing was flushed
        assert "relaygr_engine_ready 1.0" in s.get(f"{url}/metrics", timeout=30).text
        instance = f"http://127.0.0.1:{port + 1}"
        assert s.post(f"{instance}/v1/admin/flush", timeout=30).json() == {"flushed": True, "instance": "i0"}
        assert json.loads(s.get(f"{url}/v1/stats", timeout=30).text)["engine"]["cache"]["device"]["num_ready"] == 0
