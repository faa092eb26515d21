"""Affinity routing: the pre-infer and the rank of one user land on the same instance.

The routing itself is nginx's (`hash $http_x_relaygr_affinity consistent;`, serving/cluster.py);
`NginxConsistentHash` is a port of that balancer, so clients, benchmarks and tests can predict
where nginx sends a key.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence

from mindspore_relaygr.errors import RelayGRError

NGINX_POINTS_PER_WEIGHT = 160


class NoHealthyInstance(RelayGRError, RuntimeError):
    """Every instance is marked down."""


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
        """Servers in the order nginx tries them for this key (first = the chosen one).

        The key is the header value as sent, which nginx hashes byte for byte: for a user id, the
        encoded form `serving.headers.encode_affinity(user_id)` (ASCII; "é" -> "%C3%A9").
        """
        return self.ranked_for_hash(zlib.crc32(affinity_key.encode()))

    def is_last_try(self, affinity_key: str, server: str) -> bool:
        """True if `server` is the last one nginx tries for this key (when every server is tried): a
        request for this key that reached it was refused by, or could not reach, all the others."""
        if server not in self.servers:
            raise ValueError(f"{server!r} is not one of the servers {self.servers}")
        return self.ranked(affinity_key)[-1] == server

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
