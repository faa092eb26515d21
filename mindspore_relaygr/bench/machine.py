"""The machine a result was measured on, recorded in every benchmark report (`write_report`).

Results move between machines whose matmul rate differs by 2x (and drifts within a day), so every
JSON carries the CPU model, the core count, the fp32 matmul rate measured when the report is
written, the MindSpore and Python versions and the UTC date.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The "model name" of the first CPU (Linux), else platform.processor(), else "unknown"."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(matmul_runs: int = 3) -> dict[str, Any]:
    """CPU model, cores, `matmul_runs` fp32 matmul measurements (GFLOP/s; none if 0), versions, date."""
    import mindspore as ms

    from mindspore_relaygr.bench.model_bench import measure_matmul_gflops

    return {"cpu_model": cpu_model(), "cores": os.cpu_count(),
            "matmul_gflops": [round(measure_matmul_gflops(), 1) for _ in range(matmul_runs)],
            "mindspore": ms.__version__, "python": platform.python_version(),
            "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M")}
