#!/usr/bin/env bash
# Data-parallel training under MindSpore's own launcher (msrun): N worker processes on this machine, each
# building its share of every global batch (train.batch_size rows), gradients averaged across workers. CPU
# here (the workers talk over the loopback); Ascend in production with context.device_target=Ascend.
# Usage: bash scripts/run_distribute_train.sh N [CONFIG] [OUTPUT_DIR] [relaygr train args...]
#   N           number of workers (train.batch_size must be a multiple of N)
#   CONFIG      YAML config (default: configs/ml1m.yaml)
#   OUTPUT_DIR  where worker 0 writes best.ckpt, config.yaml, train_metrics.json (default: train.output_dir);
#               each worker's log goes to OUTPUT_DIR/msrun_log/
#   e.g. bash scripts/run_distribute_train.sh 2 configs/ml1m.yaml outputs/ml1m_dp2 -o train.epochs=2
set -euo pipefail
echo "Usage: bash scripts/run_distribute_train.sh N [CONFIG] [OUTPUT_DIR] [relaygr train args...]"
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "N (number of workers) must be a positive integer" >&2; exit 2; }
workers="$1"; shift
config="${1:-configs/ml1m.yaml}"
[ $# -gt 0 ] && shift
out=""
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then out="$1"; shift; fi
source scripts/setup_env.sh
args=(--config "$config" --distributed)
[ -n "$out" ] && args+=(--output-dir "$out")
log_dir="${out:-outputs/distribute}/msrun_log"
mkdir -p "$log_dir"
port="${MASTER_PORT:-$("$RELAYGR_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
echo "[distribute] $workers workers, master 127.0.0.1:$port, logs in $log_dir"
msrun --worker_num="$workers" --local_worker_num="$workers" --master_addr=127.0.0.1 --master_port="$port" \
  --log_dir="$log_dir" --join=True --cluster_time_out=600 "$(command -v relaygr)" train "${args[@]}" "$@"
