#!/usr/bin/env bash
# Main job, end to end on a fresh machine: set up the venv, train the HSTU ranker on MovieLens-100K,
# evaluate it (ours through the full and the relay path, popularity, SASRec-style), export a serving
# bundle, start a server from the bundle on 127.0.0.1, pre-infer and rank a real user over HTTP
# (top movies with titles, cache tier, timings), then stop the server.
# Usage: bash scripts/run_demo.sh [--out DIR] [--port PORT] [--epochs N] [--skip-train]
#   --out DIR      where the checkpoint, reports, bundle and server log go (default outputs/demo)
#   --port PORT    server port (default: a free one)
#   --epochs N     training epochs (default: train.epochs of configs/ml100k.yaml)
#   --skip-train   reuse DIR/best.ckpt from an earlier run
set -euo pipefail
cd "$(dirname "$0")/.."
out=outputs/demo port="" epochs="" skip_train=0
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
  step "2/6 train on MovieLens-100K (configs/ml100k.yaml)"
  train_args=(--config configs/ml100k.yaml --output-dir "$out")
  [ -n "$epochs" ] && train_args+=(-o "train.epochs=$epochs")
  relaygr train "${train_args[@]}"
fi

step "3/6 evaluate on the test split (100 sampled negatives per user)"
relaygr eval --checkpoint "$out/best.ckpt"

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
