"""mindspore-relaygr: relay long-sequence generative-recommendation ranking through a KV cache."""

from __future__ import annotations

from typing import Any

from mindspore_relaygr.config import RelayGRConfig, load_config, save_config
from mindspore_relaygr.errors import ConfigError, InvalidRequest, RelayGRError

__version__ = "0.1.0"
__all__ = ["ConfigError", "InvalidRequest", "RelayEngine", "RelayGRConfig", "RelayGRError", "RelayGRModel",
           "load_config", "save_config"]


def __getattr__(name: str) -> Any:
    # MindSpore-backed classes load lazily: importing the package stays cheap for the bookkeeping.
    if name == "RelayGRModel":
        from mindspore_relaygr.model.ranker import RelayGRModel

        return RelayGRModel
    if name == "RelayEngine":
        from mindspore_relaygr.relay.engine import RelayEngine

        return RelayEngine
    raise AttributeError(name)
