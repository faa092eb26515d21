"""The HSTU ranker: layers, device KV pool and the full / prefix / candidate graphs."""

from __future__ import annotations

from typing import Any

__all__ = ["CachedRank", "PrefillChunk", "RelayGRModel"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mindspore_relaygr.model import ranker

        return getattr(ranker, name)
    raise AttributeError(name)
