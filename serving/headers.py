"""HTTP header names of the RelayGR API: the only place they are defined.

The affinity header carries the user id in a transport-safe form, because header values are
Latin-1 on the wire (WSGI decodes them as such) and a user id is any Unicode string. The rule,
defined once here by `encode_affinity` / `decode_affinity`:

* letters, digits and ASCII punctuation other than '%' are sent as they are, so the usual ASCII
  ids ("u42", "user-7", "a@b.c") encode to themselves;
* every other character (space, '%', control characters, anything non-ASCII) is sent as the
  percent-encoded bytes of its UTF-8 encoding, upper-case hex: "é" -> "%C3%A9", "a b" -> "a%20b",
  "50%" -> "50%25". '%' is always encoded, so decoding round-trips for every string.

nginx hashes the header exactly as sent, so a client should always send `encode_affinity(user_id)`;
the server accepts any valid percent-encoding (e.g. lower-case hex) of the same id, but another
spelling may hash to another instance.
"""

from __future__ import annotations

import re
import string
import urllib.parse

AFFINITY = "X-RelayGR-Affinity"  # request: the user id (encode_affinity) the load balancer hashes on
INSTANCE = "X-RelayGR-Instance"  # response: the instance that answered
CACHE = "X-RelayGR-Cache"  # response of /v1/rank: the cache tier that served it (relay.types.CACHE_TIERS)
RETRY_AFTER = "Retry-After"  # response of a 503: seconds before retrying this instance
# request, set by the cluster's nginx on every proxied request: it chose this instance by the affinity
# hash and moves on to the next one on a 503, so a rank here that is last in its key's try order was
# refused by every other instance (direct requests, without it, are never treated so)
ROUTED = "X-RelayGR-Routed"

_AFFINITY_SAFE = string.punctuation.replace("%", "")  # letters and digits are always safe for quote()
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def nginx_variable(header: str) -> str:
    """The nginx variable holding a request header: "X-RelayGR-Affinity" -> "$http_x_relaygr_affinity"."""
    return "$http_" + header.lower().replace("-", "_")


def encode_affinity(user_id: str) -> str:
    """The affinity header value of `user_id` (ASCII; see the module docstring).

    Raises UnicodeEncodeError for a lone surrogate, which has no UTF-8 form (and is no valid user id).
    """
    return urllib.parse.quote(user_id, safe=_AFFINITY_SAFE, encoding="utf-8", errors="strict")


def decode_affinity(value: str) -> str:
    """The user id in an affinity header value; ValueError unless it is percent-encoded UTF-8."""
    if not value.isascii():
        raise ValueError("has raw non-ASCII characters; send the percent-encoded UTF-8 of the user id")
    bad = _BAD_ESCAPE.search(value)
    if bad is not None:
        raise ValueError(f"'%' at index {bad.start()} is not followed by two hex digits (send '%' as %25)")
    try:
        return urllib.parse.unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"percent-decodes to bytes that are not UTF-8 ({exc.reason} at byte {exc.start})") from None
