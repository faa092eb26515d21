"""Build and wrap the fused CPU kernels (mindspore_relaygr/kernels/rab_attention.cc) as ops.Custom.

The shared library is compiled once per machine into a cache directory keyed by the source, the
compiler and the CPU. The tiled attention and projection kernels also need oneDNN's `dnnl_sgemm`, taken
from the libdnnl that the MindSpore wheel ships. The ops come as one set (`FusedOps`): either every one of
them loads, or `require_fused_ops` raises `KernelsUnavailable` naming what is missing, and the model runs
the plain backend (model/backend.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).resolve().parents[1] / "kernels" / "rab_attention.cc"
# -ffp-contract=off: no fused multiply-add, so time differences round exactly like the reference ops.
CXX_FLAGS = ["-O3", "-march=native", "-pthread", "-ffp-contract=off", "-fno-trapping-math", "-shared", "-fPIC",
             "-std=c++17"]


def _cache_dir() -> Path:
    default = Path.home() / ".cache" / "mindspore-relaygr" / "kernels"
    return Path(os.environ.get("RELAYGR_KERNEL_DIR", default)).expanduser()


def _cpu_signature() -> str:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return platform.machine() + flags


def build_library(cxx: str | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the kernels (if not cached) and return the shared library path.

    `extra_flags` are appended to the compiler flags (tests use e.g. -mno-avx512f to build the AVX2 path)."""
    cxx = cxx or os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"C++ compiler {cxx!r} not found")
    flags = [*CXX_FLAGS, *extra_flags]
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + _cpu_signature().encode())
    target = _cache_dir() / f"rab_attention_{digest.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    cmd = [cxx, *flags, str(SOURCE), "-o", str(tmp), "-ldl"]
    logger.info("compiling fused kernels: %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"kernel build failed ({proc.returncode}): {proc.stderr[-2000:]}")
    os.replace(tmp, target)  # atomic: concurrent builders never load a half-written file
    return target


def find_onednn() -> Path | None:
    """The oneDNN library inside the installed MindSpore package, if it has one."""
    import mindspore

    lib_dir = Path(mindspore.__file__).resolve().parent / "lib"
    found = sorted(lib_dir.glob("libdnnl.so*"), reverse=True)
    return found[0] if found else None


def init_gemm(library: Path) -> bool:
    """Point the kernel library's tile GEMM at MindSpore's oneDNN; False if that is not possible."""
    onednn = find_onednn()
    if onednn is None:
        return False
    # ctypes and ops.Custom dlopen the same path, so they share the library's state.
    return ctypes.CDLL(str(library)).RelaygrInitGemm(str(onednn).encode()) == 1


@dataclass(frozen=True)
class KernelCounters:
    """Where the fused kernels' threads spent their time while the kernel profile was on (thread-seconds,
    summed over the kernel threads)."""

    gemm_calls: int  # tile GEMMs handed to oneDNN's dnnl_sgemm
    gemm_s: float  # inside them
    gemm_flops: float
    elementwise_s: float  # in the fused elementwise work around them: bias + SiLU, layer norm, gating, residual
    kernel_s: float  # anywhere in the kernels' parallel loops (includes gemm_s and elementwise_s)
    threads: int  # threads the kernels run on

    @property
    def gemm_gflops(self) -> float:
        """The tile GEMMs' own rate on all kernel threads: FLOPs per second inside them, times the threads."""
        return self.gemm_flops / self.gemm_s * self.threads / 1e9 if self.gemm_s > 0 else float("nan")


class KernelProfile:
    """Counts where the fused kernels spend their threads' time (tile GEMMs with their FLOPs, the elementwise
    work, the rest of their loops) between `start()` and `read()`.

    It is the library the ops.Custom kernels load (ctypes and ops.Custom dlopen one path, so they share its
    counters); each timed section costs two clock reads, so keep it off while measuring latency."""

    def __init__(self, library: Path | None = None) -> None:
        self._lib = ctypes.CDLL(str(library or build_library()))
        self._lib.RelaygrKernelThreads.restype = ctypes.c_int64

    def start(self) -> None:
        self._lib.RelaygrProfile(1)

    def read(self) -> KernelCounters:
        """The counters since `start()`; the profile is turned off."""
        out = (ctypes.c_int64 * 5)()
        self._lib.RelaygrProfileCounters(out)
        self._lib.RelaygrProfile(0)
        return KernelCounters(int(out[0]), out[1] / 1e9, float(out[2]), out[3] / 1e9, out[4] / 1e9,
                              int(self._lib.RelaygrKernelThreads()))


@dataclass(frozen=True)
class FusedOps:
    """The fused primitives, all of them; see rab_attention.cc for their contracts."""

    rab_index: Any  # (q_pos, q_hi, q_lo, k_pos, k_hi, k_lo, k_valid, pos_lut, thresholds, params) -> [B, K]
    # (the rab_index inputs, window [2] i64 = (q0, k0), rows [B], cols [K]) -> [B, K] for queries [q0, q0 + B) and
    # keys [k0, k0 + K) of the arrays (rows and cols only give the shape)
    rab_index_window: Any
    # (q, q_at, then key segments (k, k_at, v, v_at, idx [B or 1, K]), table [H, T], scales [2], like [B, H*dv])
    # -> [B, H*dv], summed over the segments
    attention: Any
    project_silu: Any  # (x [n, d], w [d, W], b [W]) -> SiLU(x w + b) [n, W]
    # (x, w, b, spec [1 + 2k] i64 = (first full row, column ranges...)) -> [n, W]: rows before the first full row
    # get only the listed columns (zeros elsewhere)
    project_silu_columns: Any
    # (x [n, d], av [n, e], u [n, e], gamma [e], beta [e], w2 [d, e], b2 [d], eps [1]) -> [n, d]:
    # x + (LayerNorm(av) * u) w2^T + b2
    finish_rows: Any
    # (pool [R, d] Parameter, ids [L*H*C] i32, at [5] i64, y_0 .. y_{L-1} [n, W]) -> done [1] i32: copies each
    # layer's per-head rows of y into the pool rows `ids`, in place (the slot write of the prefix graphs, batched too)
    scatter_view_rows: Any


class KernelsUnavailable(RuntimeError):
    """The fused CPU kernels cannot all be built and loaded here; the message says what is missing."""


_cached: FusedOps | None = None
_problem: str | None = None  # why they are unavailable, once a build failed


def require_fused_ops() -> FusedOps:
    """Every fused op, built once per process; raises KernelsUnavailable naming what is missing."""
    global _cached, _problem
    if _cached is None and _problem is None:
        try:
            _cached = _build_fused_ops()
        except Exception as exc:  # noqa: BLE001 - any build/load problem makes the kernels unavailable
            _problem = str(exc)
    if _cached is None:
        raise KernelsUnavailable(_problem)
    return _cached


def load_fused_ops() -> FusedOps | None:
    """`require_fused_ops()`, or None when the kernels are unavailable."""
    try:
        return require_fused_ops()
    except KernelsUnavailable:
        return None


def _build_fused_ops() -> FusedOps:
    from mindspore import dtype as mstype
    from mindspore import ops

    lib = build_library()
    onednn = find_onednn()
    if onednn is None:
        raise KernelsUnavailable("oneDNN (libdnnl.so*) not found in the MindSpore package: the attention and "
                                 "projection kernels call its dnnl_sgemm")
    if not init_gemm(lib):
        raise KernelsUnavailable(f"oneDNN at {onednn} has no usable dnnl_sgemm for the attention and projection "
                                 f"kernels")
    scatter_view_rows = ops.Custom(f"{lib}:ScatterViewRows", out_shape=lambda *shapes: (1,),
                                   out_dtype=mstype.int32, func_type="aot")
    # It writes its first input: keep the optimizer from dropping, merging or reordering calls.
    scatter_view_rows.add_prim_attr("side_effect_mem", True)
    return FusedOps(
        rab_index=ops.Custom(f"{lib}:RabIndex", out_shape=lambda qp, *rest: (qp[0], rest[2][0]),
                             out_dtype=mstype.int32, func_type="aot"),
        rab_index_window=ops.Custom(f"{lib}:RabIndexWindow", out_shape=lambda *shapes: (shapes[-2][0], shapes[-1][0]),
                                    out_dtype=mstype.int32, func_type="aot"),
        # Output [B, h * dv] takes the shape of its last input (`like`, see backend.FusedCpuOps.attention).
        attention=ops.Custom(f"{lib}:PointwiseAttention", out_shape=lambda *shapes: shapes[-1],
                             out_dtype=lambda *types: types[0], func_type="aot"),
        project_silu=ops.Custom(f"{lib}:ProjectSilu", out_shape=lambda x, w, b: (x[0], w[1]),
                                out_dtype=lambda *types: types[0], func_type="aot"),
        project_silu_columns=ops.Custom(f"{lib}:ProjectSiluColumns", out_shape=lambda x, w, b, spec: (x[0], w[1]),
                                        out_dtype=lambda *types: types[0], func_type="aot"),
        finish_rows=ops.Custom(f"{lib}:FinishRows", out_shape=lambda *shapes: shapes[0],
                               out_dtype=lambda *types: types[0], func_type="aot"),
        scatter_view_rows=scatter_view_rows,
    )
