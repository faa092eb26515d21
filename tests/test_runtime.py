"""Process settings: retained host memory stays in the process after it is freed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import sys
import numpy as np
from mindspore_relaygr import runtime

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

retain = sys.argv[1] == "retain"
if retain:
    assert runtime.retain_host_memory()
before = rss_mb()
block = np.empty(256 << 20, np.uint8)
block.fill(1)
del block
print(round(rss_mb() - before))
if retain:
    print(round(runtime.reserve_host_memory(128 << 20), 3))  # within what the heap already holds
"""


def _probe(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc behaviour")
def test_freed_block_stays_resident_only_when_retained():
    retained = _probe("retain")
    assert int(retained[0]) >= 200, "a freed 256 MB block should stay in the process"
    assert float(retained[1]) >= 0.0
    assert int(_probe("default")[0]) < 100, "without retention glibc unmaps a freed 256 MB block"


NO_RETENTION_PROBE = """
from mindspore_relaygr import runtime
print(runtime.reserve_host_memory(1 << 30))
"""


def test_reserve_is_a_no_op_without_retention():
    # A fresh process: an in-process check would find retention already on whenever an earlier test built a model.
    out = subprocess.run([sys.executable, "-c", NO_RETENTION_PROBE], capture_output=True, text=True, check=True,
                         timeout=120)
    assert float(out.stdout.split()[-1]) == 0.0


THREAD_PROBE = """
import threading
import numpy as np
from mindspore_relaygr import runtime

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

assert runtime.retain_host_memory()
runtime.reserve_host_memory(256 << 20)  # on the main thread
before = rss_mb()
kept = []
def work():  # like the device thread making slot copies
    for _ in range(8):
        block = np.empty(16 << 20, np.uint8)
        block.fill(1)
        kept.append(block)
t = threading.Thread(target=work)
t.start()
t.join()
print(round(rss_mb() - before))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc behaviour")
def test_another_thread_reuses_memory_reserved_on_the_main_thread():
    out = subprocess.run([sys.executable, "-c", THREAD_PROBE], capture_output=True, text=True, check=True,
                         timeout=120)
    grown = int(out.stdout.split()[0])
    assert grown < 64, f"128 MB of copies on a worker thread grew RSS by {grown} MB: not from the reservation"



def test_the_package_exports_what_the_readme_promises():
    from mindspore_relaygr import RelayEngine, RelayGRModel, load_config  # noqa: F401
    from mindspore_relaygr.relay.engine import RelayEngine as Engine

    assert RelayEngine is Engine


LAYERING_PROBE = """
import importlib, pkgutil, sys
import mindspore_relaygr
names = [m.name for m in pkgutil.walk_packages(mindspore_relaygr.__path__, "mindspore_relaygr.")]
for name in names:
    importlib.import_module(name)
leaked = sorted(m for m in sys.modules if m == "serving" or m.startswith("serving.") or m == "flask")
print(len(names), leaked)
"""


def test_importing_every_library_module_never_imports_serving_or_flask():
    out = subprocess.run([sys.executable, "-c", LAYERING_PROBE], capture_output=True, text=True, timeout=300,
                         check=True).stdout.split(maxsplit=1)
    assert int(out[0]) > 40 and out[1].strip() == "[]", out


DEVICE_PROBE = """
import sys
from mindspore_relaygr import runtime
from mindspore_relaygr.config import load_config
from mindspore_relaygr.errors import ConfigError

cfg = load_config(None, [f"context.device_target={sys.argv[1]}"])
try:
    runtime.configure_context(cfg.context)
except ConfigError as exc:
    print("refused:", exc)
else:
    print("configured", runtime.device_available(sys.argv[1]))
"""


def _device_probe(target: str) -> str:
    out = subprocess.run([sys.executable, "-c", DEVICE_PROBE, target], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "GLOG_v": "3"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow
def test_gpu_is_refused_with_the_reason_unless_mindspore_can_use_one():
    out = _device_probe("GPU")
    if out.startswith("configured"):
        assert out == "configured True"  # a MindSpore build with a usable GPU
    else:
        assert "context.device_target=GPU" in out and "CPU and Ascend only" in out


@pytest.mark.slow
def test_cpu_is_configured():
    assert _device_probe("CPU") == "configured True"


def test_fused_kernels_required_on_a_non_cpu_target_is_a_config_error():
    from mindspore_relaygr.config import load_config
    from mindspore_relaygr.errors import ConfigError

    with pytest.raises(ConfigError, match="model.fused_kernels=True: the fused kernels are CPU kernels"):
        load_config(None, ["context.device_target=Ascend", "model.fused_kernels=true"])
    assert load_config(None, ["context.device_target=Ascend", "model.fused_kernels=null"]).model.fused_kernels is None
