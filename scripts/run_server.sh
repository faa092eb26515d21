#!/usr/bin/env bash
# Serve the ranker over HTTP: one instance (gunicorn, one worker process) or a cluster of N
# instances behind nginx (affinity on the X-RelayGR-Affinity header).
# Usage:
#   bash scripts/run_server.sh serve   [--config configs/tiny.yaml] [--port 8080] [--instance-id i0] [-o k=v ...]
#   bash scripts/run_server.sh cluster [--config configs/tiny.yaml] [--instances 2] [--port 8080] [--detach]
#   bash scripts/run_server.sh cluster --stop [--port 8080 | --run-dir DIR]
# Everything binds 127.0.0.1 unless --host says otherwise. Ctrl-C stops what was started.
set -euo pipefail
if [ "$#" -lt 1 ] || { [ "$1" != "serve" ] && [ "$1" != "cluster" ]; }; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 1
fi
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
if [ "$1" = "cluster" ] && ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "[setup] nginx is needed for a cluster: apt-get install -y nginx" >&2
  exit 1
fi
export PATH="$PATH:/usr/sbin"
exec "$RELAYGR_PY" -m serving.cli "$@"
