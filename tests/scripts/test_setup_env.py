"""scripts/setup_env.sh: every checkout runs its own code, whatever other clones installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

PROBE = "import mindspore_relaygr, serving; print(mindspore_relaygr.__file__); print(serving.__file__)"


def test_the_test_interpreter_imports_this_checkout_from_any_directory(tmp_path):
    """Run from outside the tree (no cwd on sys.path): the editable install must point here."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.split():
        assert Path(line).resolve().is_relative_to(REPO.resolve()), (line, REPO)


def test_setup_env_gives_each_checkout_its_own_venv_over_the_shared_one():
    text = (REPO / "scripts" / "setup_env.sh").read_text()
    assert 'local_venv="$repo/.venv"' in text and 'export RELAYGR_PY="$_relaygr_repo/.venv/bin/python"' in text
    local = REPO / ".venv"
    if Path(sys.prefix).resolve() == local.resolve():  # run through scripts/run_tests.sh
        pth = next(local.glob("lib/python3*/site-packages/_relaygr_shared_venv.pth"))
        shared_site = Path(pth.read_text().strip())
        assert shared_site.is_dir() and (shared_site / "mindspore").is_dir()
        assert not list(shared_site.glob("__editable__*mindspore_relaygr*"))  # no checkout in the shared venv


@pytest.mark.slow
def test_sourcing_setup_env_keeps_the_caller_s_shell_options():
    """`source scripts/setup_env.sh` in a user's shell must not turn on errexit there (the next failing
    command would close the terminal)."""
    script = f"source {REPO / 'scripts' / 'setup_env.sh'} >/dev/null; set -o | grep -E '^(errexit|nounset)'; " \
             "false; echo alive; command -v relaygr"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert all(line.split()[-1] == "off" for line in lines[:2]) and lines[2] == "alive", out.stdout
    assert Path(lines[3]) == REPO / ".venv" / "bin" / "relaygr"
