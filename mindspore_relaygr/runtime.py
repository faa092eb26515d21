"""MindSpore process-wide settings from the `context` config section."""

from __future__ import annotations

import logging
import os

from mindspore_relaygr.config import ContextConfig

logger = logging.getLogger(__name__)
_applied: ContextConfig | None = None


def configure_context(cfg: ContextConfig) -> None:
    """Apply device target, mode and compile cache once per process (later calls must agree)."""
    global _applied
    if _applied is not None:
        if _applied != cfg:
            logger.warning("MindSpore context already set to %s; ignoring %s", _applied, cfg)
        return
    os.environ.setdefault("GLOG_v", "3")
    import mindspore as ms

    mode = ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE
    ms.set_context(mode=mode)
    ms.set_device(cfg.device_target, cfg.device_id)
    if cfg.enable_compile_cache:
        path = os.path.expanduser(cfg.compile_cache_dir)
        os.makedirs(path, exist_ok=True)
        ms.set_context(enable_compile_cache=True, compile_cache_path=path)
    if cfg.num_threads is not None:
        ms.set_context(runtime_num_threads=cfg.num_threads)
    _applied = cfg
    logger.info("MindSpore %s: %s on %s:%d", ms.__version__, cfg.mode, cfg.device_target, cfg.device_id)
