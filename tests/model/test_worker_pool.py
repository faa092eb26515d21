"""The kernels' worker pool: results do not depend on the thread count, and a forked child (whose copy of the
pool has no threads) builds its own pool instead of waiting forever on the parent's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import ctypes, os, sys
    import numpy as np
    from mindspore_relaygr.model.kernels import build_library, find_onednn

    lib = ctypes.CDLL(str(build_library()))
    assert lib.RelaygrInitGemm(str(find_onednn()).encode()) == 1
    keep = []

    def call(fn, *arrays):
        n = len(arrays)
        shapes = [(ctypes.c_int64 * a.ndim)(*a.shape) for a in arrays]
        args = (n, (ctypes.c_void_p * n)(*[a.ctypes.data for a in arrays]),
                (ctypes.c_int * n)(*[a.ndim for a in arrays]),
                (ctypes.POINTER(ctypes.c_int64) * n)(*[ctypes.cast(s, ctypes.POINTER(ctypes.c_int64)) for s in shapes]),
                (ctypes.c_char_p * n)(*[b"float32"] * n), None, None)
        keep.append((arrays, shapes, args))
        return fn(*args)

    rng = np.random.default_rng(0)
    x, w, b = (rng.normal(size=s).astype(np.float32) for s in ((300, 64), (64, 96), (96,)))
    z = x.astype(np.float64) @ w + b
    want = z / (1 + np.exp(-z))

    def project():
        y = np.zeros((300, 96), np.float32)
        assert call(lib.ProjectSilu, x, w, b, y) == 0
        return y

    np.testing.assert_allclose(project(), want, atol=1e-4)  # the parent's pool now has its workers
    pid = os.fork()
    if pid == 0:
        ok = np.allclose(project(), want, atol=1e-4) and np.allclose(project(), want, atol=1e-4)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    np.testing.assert_allclose(project(), want, atol=1e-4)  # the parent's pool still works
    sys.exit(os.waitstatus_to_exitcode(status))
''')


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_kernels_work_in_a_forked_child_and_at_any_thread_count(threads):
    import os

    env = {**os.environ, "RELAYGR_KERNEL_THREADS": threads, "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


THREADS_SCRIPT = textwrap.dedent('''
    import ctypes, os
    from mindspore_relaygr.model.kernels import build_library

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # pinned to one core, as relaygr cluster --pin-cpus
    lib = ctypes.CDLL(str(build_library()))
    lib.RelaygrKernelThreads.restype = ctypes.c_int64
    print(lib.RelaygrKernelThreads())
''')


@pytest.mark.parametrize("env_threads, expected", [(None, "1"), ("3", "3")])
def test_kernel_threads_follow_the_affinity_mask_unless_set(env_threads, expected):
    """A process pinned to one core runs its kernels on one thread (two would take turns on that core);
    RELAYGR_KERNEL_THREADS still decides when set."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "RELAYGR_KERNEL_THREADS"} | {"GLOG_v": "3"}
    if env_threads is not None:
        env["RELAYGR_KERNEL_THREADS"] = env_threads
    proc = subprocess.run([sys.executable, "-c", THREADS_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == expected
