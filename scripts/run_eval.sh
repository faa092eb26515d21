#!/usr/bin/env bash
# Leave-one-out test evaluation (HR@10, NDCG@10, MRR, AUC with 100 sampled negatives) of a checkpoint through
# the full path and the relay path, next to popularity and a SASRec-style baseline trained on the same split.
# Usage: bash scripts/run_eval.sh CHECKPOINT [relaygr eval args...]
#   CHECKPOINT  best.ckpt written by run_standalone_train.sh (its config.yaml is read from the same directory)
#   e.g. bash scripts/run_eval.sh outputs/ml100k/best.ckpt --suffix-len 8
set -euo pipefail
echo "Usage: bash scripts/run_eval.sh CHECKPOINT [relaygr eval args...]"
if [ $# -lt 1 ]; then
  exit 1
fi
cd "$(dirname "$0")/.."
checkpoint="$1"
shift
source scripts/setup_env.sh
relaygr eval --checkpoint "$checkpoint" "$@"
