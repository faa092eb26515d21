"""The port of nginx's `hash ... consistent` (what clients and tests use to predict placement): minimal
movement, down servers, the ketama points, agreement with a live nginx."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import urllib.request
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mindspore_relaygr.relay.router import NginxConsistentHash, NoHealthyInstance
from serving.headers import encode_affinity
from tests.waiting import wait_until

KEYS = [f"user-{i}" for i in range(2000)]


def test_removing_a_server_moves_only_its_keys():
    servers = [f"127.0.0.1:{9000 + k}" for k in range(5)]
    before = NginxConsistentHash(servers)
    removed = servers[2]
    after = NginxConsistentHash([s for s in servers if s != removed])
    moved = [k for k in KEYS if before.route(k) != after.route(k)]
    assert moved and all(before.route(k) == removed for k in moved)
    assert len(moved) == sum(before.route(k) == removed for k in KEYS)  # every key of the removed one moved
    # Adding a server moves only the keys that now land on it.
    grown = NginxConsistentHash(servers + ["127.0.0.1:9005"])
    moved = [k for k in KEYS if before.route(k) != grown.route(k)]
    assert moved and all(grown.route(k) == "127.0.0.1:9005" for k in moved)
    load = Counter(before.route(k) for k in KEYS)
    assert set(load) == set(servers)


def test_down_servers_fall_back_in_ranked_order():
    ring = NginxConsistentHash(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])
    key = "user-42"
    first, second, third = ring.ranked(key)
    assert ring.route(key, down={first}) == second
    assert ring.route(key, down={first, second}) == third
    with pytest.raises(NoHealthyInstance, match="all servers are down"):
        ring.route(key, down={first, second, third})
    # Keys owned by healthy servers never move when another one goes down.
    owners = {k: ring.route(k) for k in KEYS[:300]}
    assert all(ring.route(k, down={second}) == owner for k, owner in owners.items() if owner != second)


def test_the_last_try_is_the_last_server_in_the_key_s_order():
    servers = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    ring = NginxConsistentHash(servers)
    for key in KEYS[:200]:
        order = ring.ranked(key)
        assert [ring.is_last_try(key, s) for s in order] == [False, False, True]
    with pytest.raises(ValueError, match="not one of the servers"):
        ring.is_last_try("user-1", "127.0.0.1:4")
    assert NginxConsistentHash(["127.0.0.1:1"]).is_last_try("any", "127.0.0.1:1")  # one server: its only try


def test_bad_servers_are_rejected():
    with pytest.raises(ValueError, match="must be unique"):
        NginxConsistentHash(["a", "a"])
    with pytest.raises(ValueError, match=r"servers=\[\]"):
        NginxConsistentHash([])
    with pytest.raises(ValueError, match="weights="):
        NginxConsistentHash(["a"], weights=[0])


def test_nginx_points_follow_the_ketama_recipe():
    ring = NginxConsistentHash(["127.0.0.1:8081", "127.0.0.1:8082"], weights=[1, 2])
    assert ring.num_points == 3 * 160  # no crc32 collisions for these two servers
    # First point of a server: crc32("host\0port" + 4 zero bytes); the second chains on it.
    h0 = zlib.crc32(b"127.0.0.1\x008081\x00\x00\x00\x00")
    h1 = zlib.crc32(b"127.0.0.1\x008081" + h0.to_bytes(4, "little"))
    assert ring._owners[ring._hashes.index(h0)] == ring._owners[ring._hashes.index(h1)] == "127.0.0.1:8081"
    assert ring._hashes == sorted(ring._hashes)
    assert Counter(ring._owners) == {"127.0.0.1:8081": 160, "127.0.0.1:8082": 320}


def test_nginx_lookup_ties_and_wrap_around():
    ring = NginxConsistentHash(["127.0.0.1:8081", "127.0.0.1:8082", "127.0.0.1:8083"])
    hashes, owners = ring._hashes, ring._owners
    i = next(j for j in range(len(owners) - 1) if owners[j] != owners[j + 1])
    assert ring.ranked_for_hash(hashes[i])[0] == owners[i]  # equal to a point: that point
    assert ring.ranked_for_hash(hashes[i] - 1)[0] == owners[i]
    assert ring.ranked_for_hash(hashes[i] + 1)[0] == owners[i + 1]  # just past it: the next point
    assert ring.ranked_for_hash(hashes[-1] + 1)[0] == owners[0]  # past the last point: wrap to the first
    assert ring.ranked_for_hash(0)[0] == owners[0]
    assert ring.route("") == owners[0]  # crc32("") == 0
    # Fallback order: distinct servers in point order after the chosen point.
    expected = list(dict.fromkeys(owners[i:] + owners[:i]))
    assert ring.ranked_for_hash(hashes[i]) == expected
    for k in KEYS[:200]:
        assert ring.route(k) == ring.ranked_for_hash(zlib.crc32(k.encode()))[0]


# Where nginx 1.22.1 sent these keys (recorded with backends on these exact ports): guards the port
# in environments without nginx. test_nginx_agrees_with_python_port re-checks against a live nginx.
RECORDED_SERVERS = ["127.0.0.1:18081", "127.0.0.1:18082", "127.0.0.1:18083"]
RECORDED = {f"user-{i}": f"127.0.0.1:1808{n}" for i, n in enumerate("112121323311")}


def test_nginx_port_matches_recorded_nginx_routes():
    ring = NginxConsistentHash(RECORDED_SERVERS)
    assert {k: ring.route(k) for k in RECORDED} == RECORDED


def test_nginx_host_port_parsing_edge_cases():
    # "host" without a port and "unix:" sockets hash "host\0"; non-digit tails are part of the host.
    for server, base in [
        ("backend", b"backend\0"),
        ("unix:/tmp/s.sock", b"/tmp/s.sock\0"),
        ("[::1]:8080", b"[::1]\x008080"),
        ("host:", b"host\0"),
        ("a:b", b"a:b\0"),
    ]:
        ring = NginxConsistentHash([server])
        assert zlib.crc32(base + b"\0\0\0\0") in ring._hashes, server


# ---------------------------------------------------------------- real nginx


class _PortEcho(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        body = str(self.server.server_address[1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NGINX_CONF = """\
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream relaygr {{
        hash $http_x_relaygr_affinity consistent;
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://relaygr;
            proxy_next_upstream off;
        }}
    }}
}}
"""


def route_through_nginx(
    tmp: Path, servers: list[str], keys: list[str], down: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Start nginx (own prefix and config in `tmp`) in front of `servers`; key -> server that answered."""
    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).is_file()), None
    )
    if nginx is None:
        pytest.fail("nginx is not installed (apt-get install -y nginx); this test needs a real nginx")
    port = _free_port()
    lines = "\n".join(f"        server {s}{' down' if s in down else ''};" for s in servers)
    (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, servers=lines, port=port))
    proc = subprocess.Popen(
        [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        def listening() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"nginx exited with {proc.returncode}: {proc.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_until(listening, what=f"nginx to listen on 127.0.0.1:{port}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never an env proxy
        out = {}
        for key in keys:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/", headers={"X-RelayGR-Affinity": key})
            with opener.open(req, timeout=5) as resp:
                out[key] = f"127.0.0.1:{resp.read().decode()}"
        return out
    finally:
        proc.terminate()  # by PID: the master we started
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.fixture
def backends():
    """Three stdlib HTTP servers on 127.0.0.1 answering with their own port."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _PortEcho) for _ in range(3)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    try:
        yield [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("down_index", [None, 1], ids=["all_up", "one_down"])
def test_nginx_agrees_with_python_port(tmp_path, backends, down_index):
    # Non-ASCII ids travel percent-encoded (serving.headers): the port hashes that same header value.
    unicode_ids = ["é", "用户1", "🙂", "👨\u200d👩\u200d👧", "50% off", "a%41 b", " ", "Ω≈ç√∫"]
    keys = [str(u) for u in range(100)] + [encode_affinity(u) for u in unicode_ids]
    down = frozenset() if down_index is None else frozenset({backends[down_index]})
    landed = route_through_nginx(tmp_path, backends, keys, down)
    ring = NginxConsistentHash(backends)
    predicted = {k: ring.route(k, down=down) for k in keys}
    wrong = {k: (landed[k], predicted[k]) for k in keys if landed[k] != predicted[k]}
    assert not wrong, f"nginx vs port disagree on {len(wrong)} keys (key: (nginx, port)): {wrong}"
    assert set(landed.values()) == set(backends) - down  # the check is not vacuous
