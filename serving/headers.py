"""HTTP header names of the RelayGR API: the only place they are defined."""

from __future__ import annotations

AFFINITY = "X-RelayGR-Affinity"  # request: the user id the load balancer hashes on
INSTANCE = "X-RelayGR-Instance"  # response: the instance that answered
CACHE = "X-RelayGR-Cache"  # response of /v1/rank: the cache tier that served it (relay.types.CACHE_TIERS)
RETRY_AFTER = "Retry-After"  # response of a 503: seconds before retrying this instance


def nginx_variable(header: str) -> str:
    """The nginx variable holding a request header: "X-RelayGR-Affinity" -> "$http_x_relaygr_affinity"."""
    return "$http_" + header.lower().replace("-", "_")
