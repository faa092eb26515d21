"""Cluster spec, the generated nginx.conf (checked by `nginx -t` when nginx is installed), settings."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mindspore_relaygr.errors import ConfigError
from serving import headers
from serving.cluster import ClusterError, ClusterSpec, find_nginx, render_nginx_conf
from serving.settings import load_from_env, resolve_settings, to_env
from tests.conftest import CONFIGS, REPO


def test_spec_ports_ids_and_servers(tmp_path):
    spec = ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path)
    assert spec.instance_ids == ["i0", "i1", "i2"]
    assert spec.instance_ports == [9001, 9002, 9003]
    assert spec.servers == ["127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"]
    assert spec.ring().servers == spec.servers
    for bad in ({"num_instances": 0}, {"port": 65535}, {"max_fails": -1}, {"fail_timeout_s": 0}, {"max_conns": 0}):
        with pytest.raises(ClusterError):
            ClusterSpec(**{"port": 9000, "num_instances": 2, "run_dir": tmp_path, **bad})


def test_rendered_nginx_conf_hashes_on_the_affinity_header(tmp_path):
    spec = ClusterSpec(port=9000, num_instances=2, run_dir=tmp_path, max_fails=2, fail_timeout_s=7.5,
                       max_body_bytes=1234567, max_conns=48)
    conf = render_nginx_conf(spec)
    assert "hash $http_x_relaygr_affinity consistent;" in conf
    assert headers.nginx_variable(headers.AFFINITY) == "$http_x_relaygr_affinity"
    assert "server 127.0.0.1:9001 max_fails=2 fail_timeout=7.5s max_conns=48;" in conf
    assert "server 127.0.0.1:9002 max_fails=2 fail_timeout=7.5s max_conns=48;" in conf
    assert "proxy_next_upstream error timeout http_503 non_idempotent;" in conf
    assert 'proxy_set_header X-RelayGR-Routed "affinity";' in conf
    assert "listen 127.0.0.1:9000;" in conf and "client_max_body_size 1234567;" in conf
    assert f"pid {tmp_path.resolve()}/nginx.pid;" in conf and re.search(r"@[A-Z_]+@", conf) is None


def test_template_placeholders_must_match(tmp_path):
    bad = tmp_path / "t.template"
    bad.write_text("listen @HOST@:@PORT@; @UNKNOWN@")
    with pytest.raises(ClusterError, match="UNKNOWN"):
        render_nginx_conf(ClusterSpec(port=9000, num_instances=1, run_dir=tmp_path), bad)


def test_generated_conf_passes_nginx_t(tmp_path):
    try:
        nginx = find_nginx()
    except ClusterError:
        pytest.fail("nginx is not installed (apt-get install -y nginx); scripts/run_tests.sh installs it")
    spec = ClusterSpec(port=9000, num_instances=3, run_dir=tmp_path)
    for sub in ("logs", "tmp"):
        (tmp_path / sub).mkdir()
    (tmp_path / "nginx.conf").write_text(render_nginx_conf(spec))
    out = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e",
                          str(tmp_path / "logs" / "e.log")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_find_nginx_explains_a_missing_binary(tmp_path):
    with pytest.raises(ClusterError, match="apt-get install -y nginx"):
        find_nginx(str(tmp_path / "no-nginx"))
    assert shutil.which("nginx") is None or find_nginx() == shutil.which("nginx")


def test_settings_round_trip_through_the_environment():
    settings = {"host": "127.0.0.1", "port": 8123, "instance_id": "i7", "threads": 3, "access_log": True,
                "timeout_s": 9.5, "admin_token": "a-long-token"}
    env = to_env(str(CONFIGS / "tiny.yaml"), ["cache.num_slots=2"], settings)
    config, resolved = load_from_env(env)
    assert config.cache.num_slots == 2 and config.model.version == "tiny-dev"
    assert (resolved.port, resolved.instance_id, resolved.threads, resolved.access_log) == (8123, "i7", 3, True)
    assert resolved.timeout_s == 9.5 and resolved.admin_token == "a-long-token"
    assert Path(env["RELAYGR_CONFIG"]).is_absolute()


def test_upstream_servers_come_through_the_environment_as_json():
    servers = ["127.0.0.1:8001", "127.0.0.1:8002"]
    env = to_env(str(CONFIGS / "tiny.yaml"), [], {"port": 8001, "upstream_servers": servers})
    assert json.loads(env["RELAYGR_SERVING_UPSTREAM_SERVERS"]) == servers
    _, resolved = load_from_env(env)
    assert resolved.upstream_servers == servers and resolved.upstream_address == "127.0.0.1:8001"
    with pytest.raises(ConfigError, match="RELAYGR_SERVING_UPSTREAM_SERVERS"):
        load_from_env({**env, "RELAYGR_SERVING_UPSTREAM_SERVERS": "127.0.0.1:8001"})


@pytest.mark.parametrize("bad, match", [
    ({"upstream_servers": []}, "upstream_servers"), ({"upstream_servers": ["a", "a"]}, "upstream_servers"),
    ({"port": 0}, "serving.port=0"), ({"threads": 0}, "serving.threads=0"), ({"instance_id": "a b"}, "instance_id"),
    ({"admin_token": "short"}, "<hidden>"), ({"max_content_length": 10}, "max_content_length"),
    ({"log_level": "loud"}, "log_level"), ({"nope": 1}, "unknown serving settings"),
])
def test_settings_are_validated(tiny_config, bad, match):
    with pytest.raises(ConfigError, match=match):
        resolve_settings(tiny_config, **bad)


@pytest.mark.parametrize("env, match", [
    ({"RELAYGR_SERVING_PORT": "eighty"}, "RELAYGR_SERVING_PORT"),
    ({"RELAYGR_SERVING_ACCESS_LOG": "maybe"}, "ACCESS_LOG"),
    ({"RELAYGR_SERVING_MAX_CONTENT_LENGTH": "4096.5"}, "MAX_CONTENT_LENGTH"),  # not an integer
    ({"RELAYGR_OVERRIDES": "{"}, "RELAYGR_OVERRIDES"),
    ({"RELAYGR_OVERRIDES": '["cache.num_slots=0"]'}, "cache.num_slots=0"),
])
def test_bad_environment_is_a_config_error(env, match):
    with pytest.raises(ConfigError, match=match):
        load_from_env(env)


def test_numbers_in_the_environment_read_like_the_config_file():
    _, settings = load_from_env({"RELAYGR_SERVING_MAX_CONTENT_LENGTH": "4e6", "RELAYGR_SERVING_PARSE_WAIT_MS": "2.5e1"})
    assert (settings.max_content_length, settings.parse_wait_ms) == (4_000_000, 25.0)


def test_a_bundle_that_is_not_one_is_rejected_before_serving(tmp_path):
    from mindspore_relaygr.errors import BundleError

    with pytest.raises(BundleError, match="manifest.json is missing"):
        load_from_env({"RELAYGR_BUNDLE": str(tmp_path)})
    out = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--bundle", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "manifest.json is missing" in out.stderr


def test_warmup_progress_is_the_last_warmup_line_of_an_instance_log(tmp_path):
    from serving.cluster import warmup_progress

    log = tmp_path / "i0.log"
    assert warmup_progress(str(log)) is None  # no log yet
    prefix = "[2026] [INFO] mindspore_relaygr.model.ranker: warm-up: "
    log.write_text(f"[INFO] building the engine\n{prefix}graph 1 of 12 compiled (full (64, 8)), 1.0 s\n"
                   f"{prefix}graph 2 of 12 compiled (full (128, 8)), 2.5 s\n[INFO] something else\n")
    assert warmup_progress(str(log)) == "graph 2 of 12 compiled (full (128, 8)), 2.5 s"
