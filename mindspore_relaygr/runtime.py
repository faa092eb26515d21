"""MindSpore process-wide settings from the `context` config section."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import subprocess
import sys

from mindspore_relaygr.config import ContextConfig
from mindspore_relaygr.errors import ConfigError

logger = logging.getLogger(__name__)
_applied: ContextConfig | None = None
_retaining = False
_reserved = 0  # largest reservation made in this process (the heap keeps it)

# glibc mallopt parameters
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def retain_host_memory() -> bool:
    """Make glibc keep freed memory in the process: no mmap for large blocks, no trimming.

    Large host buffers (DRAM-tier slot copies, per-layer reload arrays) are then reused from the
    heap instead of being unmapped and faulted in again. On this VM freed pages go back to the host
    within seconds and re-touching them costs ~2.5 ms per MB (a 42 MB slot copy: ~105 ms instead
    of ~2.5 ms). Returns False where mallopt is unavailable (not glibc); then nothing changes.
    """
    global _retaining
    if _retaining:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        mallopt = None
    if mallopt is None:
        logger.info("mallopt unavailable: host memory is not retained")
        return False
    # One arena for all threads: otherwise the device thread (which makes the slot copies) allocates from
    # an arena of its own, and the memory reserved on the main thread is never reused by it.
    _retaining = (bool(mallopt(_M_ARENA_MAX, 1)) and bool(mallopt(_M_MMAP_MAX, 0))
                  and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)))
    return _retaining


def reserve_host_memory(nbytes: int) -> float:
    """Touch `nbytes` of host memory once and free it, so that later buffers reuse faulted-in pages.

    Only meaningful after retain_host_memory() (otherwise the pages go straight back). Returns the
    seconds it took (~2.2 s per GB here)."""
    import time

    import numpy as np

    global _reserved
    if not _retaining or nbytes <= _reserved:
        return 0.0
    t0 = time.perf_counter()
    block = np.empty(int(nbytes), np.uint8)
    block.fill(0)
    del block
    _reserved = int(nbytes)
    return time.perf_counter() - t0


ASCEND_PRECISION_MODE = "must_keep_origin_dtype"  # no automatic fp16/bf16 casts of fp32 operators


def device_available(target: str) -> bool:
    """Whether the installed MindSpore can run on `target` here (its backend is built and a device found)."""
    if target == "CPU":
        return True
    from mindspore import hal

    return bool(hal.is_available(target))


def require_device(target: str) -> None:
    """Refuse a device target this MindSpore cannot use, naming the reason, before any graph is built."""
    if device_available(target):
        return
    import mindspore as ms

    if target == "GPU":
        raise ConfigError(f"context.device_target=GPU: MindSpore {ms.__version__} cannot use a GPU here. "
                          "Official MindSpore releases after 2.3 support CPU and Ascend only; use CPU or Ascend")
    raise ConfigError(f"context.device_target={target}: MindSpore {ms.__version__} finds no usable {target} "
                      "device (is the Ascend CANN toolkit installed and its environment sourced?)")


_PROBE = """
import sys
from mindspore_relaygr.errors import ConfigError
from mindspore_relaygr.runtime import require_device
try:
    require_device(sys.argv[1])
except ConfigError as exc:
    print(exc, file=sys.stderr)
    sys.exit(2)
"""


def probe_device(target: str, timeout_s: float = 600.0) -> None:
    """`require_device` in a child process: a process that forks or execs afterwards (gunicorn) must not
    have touched MindSpore or the device itself. CPU needs no probe."""
    if target == "CPU":
        return
    env = dict(os.environ)
    env.setdefault("GLOG_v", "3")  # MindSpore's C++ logs stay quiet
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, target], capture_output=True, text=True, env=env,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"context.device_target={target}: probing the device took over {timeout_s:g} s") from None
    if done.returncode == 0:
        return
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == 2 and lines:
        raise ConfigError(lines[-1])
    raise ConfigError(f"context.device_target={target}: probing the device failed (exit {done.returncode}): "
                      f"{' '.join(lines[-3:])}")


def keep_fp32_on_ascend() -> None:
    """Make Ascend run fp32 operators in fp32. Its default precision mode may compute them in fp16,
    which breaks the relay's exactness invariant (cached and full scores equal within 1e-5)."""
    try:
        from mindspore.device_context.ascend.op_precision import precision_mode
    except ImportError:  # MindSpore < 2.5
        import mindspore as ms

        ms.set_context(ascend_config={"precision_mode": ASCEND_PRECISION_MODE})
    else:
        precision_mode(ASCEND_PRECISION_MODE)


def configure_context(cfg: ContextConfig) -> None:
    """Apply device target, mode and compile cache once per process (later calls must agree)."""
    global _applied
    if _applied is not None:
        if _applied != cfg:
            logger.warning("MindSpore context already set to %s; ignoring %s", _applied, cfg)
        return
    os.environ.setdefault("GLOG_v", "3")
    if cfg.retain_host_memory:
        retain_host_memory()
    import mindspore as ms

    require_device(cfg.device_target)
    mode = ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE
    ms.set_context(mode=mode)
    ms.set_device(cfg.device_target, cfg.device_id)
    if cfg.device_target == "Ascend":
        keep_fp32_on_ascend()
    if cfg.enable_compile_cache:
        path = os.path.expanduser(cfg.compile_cache_dir)
        os.makedirs(path, exist_ok=True)
        ms.set_context(enable_compile_cache=True, compile_cache_path=path)
    if cfg.num_threads is not None:
        ms.set_context(runtime_num_threads=cfg.num_threads)
    _applied = cfg
    logger.info("MindSpore %s: %s on %s:%d", ms.__version__, cfg.mode, cfg.device_target, cfg.device_id)
