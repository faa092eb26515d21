#!/usr/bin/env bash
# Train the HSTU ranker on one device (CPU by default): best checkpoint, resolved config and metrics JSON
# in the output directory.
# Usage: bash scripts/run_standalone_train.sh [CONFIG] [OUTPUT_DIR] [relaygr train args...]
#   CONFIG      YAML config (default: configs/ml100k.yaml)
#   OUTPUT_DIR  where best.ckpt, config.yaml and train_metrics.json go (default: train.output_dir of CONFIG)
#   e.g. bash scripts/run_standalone_train.sh configs/ml100k.yaml outputs/ml100k -o train.epochs=2
set -euo pipefail
echo "Usage: bash scripts/run_standalone_train.sh [CONFIG] [OUTPUT_DIR] [relaygr train args...]"
cd "$(dirname "$0")/.."
config="${1:-configs/ml100k.yaml}"
[ $# -gt 0 ] && shift
args=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  args+=(--output-dir "$1")
  shift
fi
source scripts/setup_env.sh
relaygr train --config "$config" "${args[@]}" "$@"
