#!/usr/bin/env bash
# Run the whole test suite (slow tests included) in the project venv.
# Usage: bash scripts/run_tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
# The load-balancer tests run a real nginx (Debian package).
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "[setup] installing nginx (Debian package) for the load-balancer tests"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq nginx >/dev/null
fi
export PATH="$PATH:/usr/sbin"
"$RELAYGR_PY" -m ruff check mindspore_relaygr serving tests scripts
set +e
# Test files run in parallel worker processes, a file's tests in one worker (they share its module fixtures):
# one more than the cores, at most 4, since many tests wait on servers and subprocesses; the 15 slowest tests
# are listed at the end;
# RELAYGR_TEST_WORKERS=0 runs everything in this process.
workers="${RELAYGR_TEST_WORKERS:-$(( $(nproc) < 3 ? $(nproc) + 1 : 4 ))}"
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --dist loadfile)
"$RELAYGR_PY" -m pytest -q -rs --durations=15 -p no:cacheprovider --timeout=1800 "${parallel[@]}" "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as a failure" >&2
  exit 1
fi
exit "$rc"
