#!/usr/bin/env bash
# Main job, end to end on a fresh machine: set up the venv, train the HSTU ranker on MovieLens-1M (a short
# schedule of configs/ml1m.yaml), evaluate it by full ranking over all movies through the full and the relay
# path (the metrics must be identical), export a serving bundle, start a server from the bundle on
# 127.0.0.1, pre-infer and rank a real user over HTTP (top movies with titles, cache tier, timings), then
# stop the server.
# Usage: bash scripts/run_demo.sh [--out DIR] [--port PORT] [--epochs N] [--skip-train]
#   --out DIR      where the checkpoint, reports, bundle and server log go (default outputs/demo)
#   --port PORT    server port (default: a free one)
#   --epochs N     training epochs (default: DEMO_EPOCHS below; configs/ml1m.yaml trains up to 100)
#   --skip-train   reuse DIR/best.ckpt from an earlier run
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_EPOCHS=5
DEMO_EVAL_USERS=1000
out=outputs/demo port="" epochs="$DEMO_EPOCHS" skip_train=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --skip-train) skip_train=1; shift ;;
    *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
step() { echo; echo "=== [demo $(( $(date +%s) - start ))s] $*"; }

step "1/6 environment"
source scripts/setup_env.sh
mkdir -p "$out"

if [ "$skip_train" = 1 ] && [ -f "$out/best.ckpt" ]; then
  step "2/6 training skipped: reusing $out/best.ckpt"
else
  step "2/6 train on MovieLens-1M (configs/ml1m.yaml, $epochs epochs)"
  relaygr train --config configs/ml1m.yaml --output-dir "$out" -o "train.epochs=$epochs" \
    -o "train.eval_every=$epochs" -o train.max_eval_users=$DEMO_EVAL_USERS
fi

step "3/6 evaluate on the test split: all 3706 movies ranked, first $DEMO_EVAL_USERS users, full and relay path"
relaygr eval --checkpoint "$out/best.ckpt" --baselines popularity --max-users $DEMO_EVAL_USERS

step "4/6 export a serving bundle"
relaygr export --checkpoint "$out/best.ckpt" --out-dir "$out/bundle" --overwrite

step "5/6 start a server from the bundle"
[ -n "$port" ] || port=$("$RELAYGR_PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
relaygr serve --bundle "$out/bundle" --host 127.0.0.1 --port "$port" --instance-id demo \
  --log-file "$out/server.log" &
server=$!
stop_server() {
  if kill -0 "$server" 2>/dev/null; then
    echo "[demo] stopping the server (pid $server)"
    kill -TERM "$server" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$server" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$server" 2>/dev/null || true
  fi
}
trap stop_server EXIT
echo "[demo] server pid $server on http://127.0.0.1:$port (log: $out/server.log); warming up"

step "6/6 pre-infer and rank a real user over HTTP"
"$RELAYGR_PY" -m serving.demo_client --bundle "$out/bundle" --url "http://127.0.0.1:$port"

stop_server
trap - EXIT
step "done in $(( $(date +%s) - start )) s: reports in $out (eval_test.json, train_metrics.json), bundle in $out/bundle"
