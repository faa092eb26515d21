"""The HSTU ranker: layers, device KV pool and the full / prefix / candidate graphs."""

from __future__ import annotations

from typing import Any

__all__ = ["RelayGRModel"]


def __getattr__(name: str) -> Any:
    if name == "RelayGRModel":
        from mindspore_relaygr.model.ranker import RelayGRModel

        return RelayGRModel
    raise AttributeError(name)
