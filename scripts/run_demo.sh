#!/usr/bin/env bash
# Main job, end to end on a fresh machine: set up the venv, build the ranker, prefill one user's
# prefix into the device KV pool, rank candidates both through the full path and through the
# cache, and print the scores, their max difference and timings.
# Usage: bash scripts/run_demo.sh [relaygr demo args...]   e.g. --config configs/bench_long.yaml --events 2048
set -euo pipefail
cd "$(dirname "$0")/.."
echo "[demo] setting up the environment"
source scripts/setup_env.sh
relaygr demo "$@"
