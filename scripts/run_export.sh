#!/usr/bin/env bash
# Export a checkpoint as a serving bundle: resolved config, checkpoint, item/user vocabularies, model version,
# MindIR files of the prefix and candidate graphs and a manifest of sha256 sums (verified when loaded).
# Usage: bash scripts/run_export.sh CHECKPOINT [BUNDLE_DIR] [relaygr export args...]
#   CHECKPOINT  best.ckpt written by run_standalone_train.sh (its config.yaml is read from the same directory)
#   BUNDLE_DIR  default: bundle/ next to the checkpoint
#   e.g. bash scripts/run_export.sh outputs/ml100k/best.ckpt outputs/ml100k/bundle --overwrite
set -euo pipefail
echo "Usage: bash scripts/run_export.sh CHECKPOINT [BUNDLE_DIR] [relaygr export args...]"
if [ $# -lt 1 ]; then
  exit 1
fi
cd "$(dirname "$0")/.."
checkpoint="$1"
shift
args=()
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  args+=(--out-dir "$1")
  shift
fi
source scripts/setup_env.sh
relaygr export --checkpoint "$checkpoint" "${args[@]}" "$@"
