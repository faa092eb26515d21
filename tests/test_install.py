"""Installed use: the wheel built from this checkout works outside the source tree."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def _site_of(module: str) -> Path:
    """The site-packages directory a dependency is installed in (without importing it)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.submodule_search_locations, f"{module} is not installed"
    return Path(next(iter(spec.submodule_search_locations))).parent


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_tree(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "-w", str(wheels), str(REPO)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("mindspore_relaygr-*.whl")

    # A fresh venv that sees the already installed dependencies (MindSpore is ~2.5 GB) and nothing else.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = sorted({str(_site_of(m)) for m in ("mindspore", "yaml", "flask", "gunicorn", "numpy", "pip")})
    Path(site, "deps.pth").write_text("\n".join(deps) + "\n")
    install = subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"GLOG_v": "3"}

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    help_ = run(str(venv / "bin" / "relaygr"), "--help")
    assert help_.returncode == 0 and "serve" in help_.stdout and "cluster" in help_.stdout, help_.stderr
    probe = run(str(py), "-c", "import mindspore_relaygr; from mindspore_relaygr.config import load_config; "
                               "from mindspore_relaygr.shipped_configs import shipped_config; "
                               "print(mindspore_relaygr.__file__); print(load_config(shipped_config('ml1m.yaml'))"
                               ".model.max_seq_len)")
    assert probe.returncode == 0, probe.stderr
    module_file, max_seq_len = probe.stdout.split()
    assert Path(module_file).is_relative_to(venv) and int(max_seq_len) > 0  # the wheel's copy, its config
    demo = run(str(venv / "bin" / "relaygr"), "demo")  # the default config (tiny.yaml) comes with the wheel
    assert demo.returncode == 0, demo.stderr[-2000:]

    # Shipped configs by name from anywhere, and --help says which one is the default.
    for command, default in (("demo", "tiny"), ("train", "ml1m"), ("serve", "tiny")):
        shown = run(str(venv / "bin" / "relaygr"), command, "--help")
        assert shown.returncode == 0 and "default: " + default in " ".join(shown.stdout.split()), shown.stdout
        assert "event_log" in shown.stdout  # the shipped configs are listed
    for name in ("tiny", "tiny.yaml", "configs/tiny.yaml", "event_log"):
        # the config resolves (a data error follows: the log does not exist), one line, exit 2
        bad = run(str(venv / "bin" / "relaygr"), "train", "--config", name, "-o", "data.path=missing.csv")
        assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1] == \
            "relaygr: error: missing.csv: file not found", bad.stderr[-2000:]
    unknown = run(str(venv / "bin" / "relaygr"), "demo", "--config", "tiniest")
    assert unknown.returncode == 2
    assert "does not exist, nor is it a shipped config (bench_long, bench_xl, event_log, ml100k, ml1m" in \
        unknown.stderr, unknown.stderr
