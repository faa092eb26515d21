"""Affinity routing: the pre-infer and the rank of one user land on the same instance.

`AffinityRouter` maps an affinity key (user id) to an instance by rendezvous (highest random
weight) hashing, or by `NginxConsistentHash`, a port of nginx's `hash $key consistent;` upstream
balancer, so clients and tests can predict where a real nginx sends a key.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import threading
import zlib
from collections.abc import Sequence

from mindspore_relaygr.errors import RelayGRError

logger = logging.getLogger(__name__)

ROUTER_METHODS = ("rendezvous", "nginx")
NGINX_POINTS_PER_WEIGHT = 160


class NoHealthyInstance(RelayGRError, RuntimeError):
    """Every instance is marked down."""


def rendezvous_score(affinity_key: str, instance: str) -> int:
    """Stable 64-bit weight of (key, instance); the highest weight wins."""
    digest = hashlib.blake2b(f"{instance}\0{affinity_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _check_names(names: Sequence[str], what: str) -> list[str]:
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{what}={names!r}: must be a non-empty list of non-empty strings")
    if len(set(names)) != len(names):
        raise ValueError(f"{what}={names!r}: must be unique")
    return names


class NginxConsistentHash:
    """Python port of ngx_http_upstream_hash_module's `hash $key consistent;` (ketama points).

    `servers` are written exactly as in the upstream block ("127.0.0.1:8081", "unix:/path"); the
    optional `weights` match `server ... weight=N`. Each server gets 160 points per unit weight:
    point j is crc32(host "\\0" port prev) with prev the previous point's hash as 4 little-endian
    bytes (0 for the first). Points are sorted and equal hashes deduplicated (first kept). A key
    goes to the first point >= crc32(key), wrapping around; a server marked down (or already
    tried) is skipped by walking on to the next points.
    """

    def __init__(self, servers: Sequence[str], weights: Sequence[int] | None = None) -> None:
        self.servers = _check_names(servers, "servers")
        weights = [1] * len(self.servers) if weights is None else list(weights)
        if len(weights) != len(self.servers) or not all(isinstance(w, int) and w >= 1 for w in weights):
            raise ValueError(f"weights={weights!r}: need one int >= 1 per server")
        points: list[tuple[int, str]] = []
        for server, weight in zip(self.servers, weights, strict=True):
            base = _nginx_host_port(server)
            prev = 0
            for _ in range(weight * NGINX_POINTS_PER_WEIGHT):
                prev = zlib.crc32(base + prev.to_bytes(4, "little"))
                points.append((prev, server))
        points.sort(key=lambda p: p[0])  # stable, like glibc's merge-sort qsort: first of a tie kept
        self._hashes: list[int] = []
        self._owners: list[str] = []
        for h, server in points:
            if not self._hashes or self._hashes[-1] != h:
                self._hashes.append(h)
                self._owners.append(server)

    @property
    def num_points(self) -> int:
        return len(self._hashes)

    def ranked(self, affinity_key: str) -> list[str]:
        """Servers in the order nginx tries them for this key (first = the chosen one)."""
        return self.ranked_for_hash(zlib.crc32(affinity_key.encode()))

    def ranked_for_hash(self, key_hash: int) -> list[str]:
        """Servers in try order from the first point >= `key_hash` (a point equal to it wins; wraps)."""
        start = bisect.bisect_left(self._hashes, key_hash)
        order: list[str] = []
        n = len(self._owners)
        for i in range(start, start + n):
            server = self._owners[i % n]
            if server not in order:
                order.append(server)
                if len(order) == len(self.servers):
                    break
        return order

    def route(self, affinity_key: str, down: frozenset[str] | set[str] = frozenset()) -> str:
        """The server nginx picks for this key when the servers in `down` are marked down."""
        for server in self.ranked(affinity_key):
            if server not in down:
                return server
        raise NoHealthyInstance(f"all servers are down: {self.servers}")


def _nginx_host_port(server: str) -> bytes:
    """b"host\\0port" as nginx hashes it: the port is the trailing digits after the last ':'."""
    raw = server.encode()
    if raw[:5].lower() == b"unix:":
        return raw[5:] + b"\0"
    host, sep, port = raw.rpartition(b":")
    if sep and port.isdigit():  # "" and non-digits mean no port, like nginx's backward scan
        return host + b"\0" + port
    if sep and not port:
        return host + b"\0"
    return raw + b"\0"


class AffinityRouter:
    """Maps an affinity key to a healthy instance; keys move minimally when instances change."""

    def __init__(self, instances: Sequence[str], method: str = "rendezvous") -> None:
        if method not in ROUTER_METHODS:
            raise ValueError(f"method={method!r}: must be one of {ROUTER_METHODS}")
        self.instances = _check_names(instances, "instances")
        self.method = method
        self._nginx = NginxConsistentHash(self.instances) if method == "nginx" else None
        self._down: frozenset[str] = frozenset()  # replaced, never mutated: reads need no lock
        self._lock = threading.Lock()  # serialises mark_down / mark_up

    def ranked(self, affinity_key: str) -> list[str]:
        """All instances in fallback order for this key, health ignored."""
        if self._nginx is not None:
            return self._nginx.ranked(affinity_key)
        return sorted(self.instances, key=lambda inst: (-rendezvous_score(affinity_key, inst), inst))

    def route(self, affinity_key: str) -> str:
        """The first healthy instance of `ranked(affinity_key)`."""
        down = self._down
        for inst in self.ranked(affinity_key):
            if inst not in down:
                return inst
        raise NoHealthyInstance(f"all instances are marked down: {self.instances}")

    def mark_down(self, instance: str) -> None:
        """Stop routing to `instance` until `mark_up`."""
        self._check_known(instance)
        with self._lock:
            self._down = self._down | {instance}
        logger.info("instance %s marked down", instance)

    def mark_up(self, instance: str) -> None:
        """Route to `instance` again."""
        self._check_known(instance)
        with self._lock:
            self._down = self._down - {instance}
        logger.info("instance %s marked up", instance)

    def healthy(self) -> list[str]:
        """Instances not marked down, in configuration order."""
        down = self._down
        return [i for i in self.instances if i not in down]

    def _check_known(self, instance: str) -> None:
        if instance not in self.instances:
            raise ValueError(f"instance={instance!r}: unknown; known {self.instances}")
