#!/usr/bin/env bash
# The README's main job on a bundled server: start the demo inference server
# (SmolLM2-135M on CPU, continuous batching, OpenAI API), record it with
# inferprobe while the load generator drives it, print the report.
# Run as root after scripts/setup.sh (make demo does both).
set -euo pipefail
cd "$(dirname "$0")/.."
IP=.venv/bin/inferprobe
OUT=${OUT:-out}
DURATION=${DURATION:-20}      # seconds recorded
CONCURRENCY=${CONCURRENCY:-8} # streams in flight
PORT=${PORT:-8000}
export HF_HUB_OFFLINE=1
mkdir -p "$OUT"

cleanup() {
    [[ -n "${REC_PID:-}" ]] && kill "$REC_PID" 2>/dev/null || true
    if [[ -n "${SRV_PID:-}" ]] && kill "$SRV_PID" 2>/dev/null; then
        for _ in $(seq 40); do kill -0 "$SRV_PID" 2>/dev/null || break; sleep 0.25; done
        kill -9 "$SRV_PID" 2>/dev/null || true
    fi
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_for_line PID LOG PATTERN SECONDS: until LOG has a line matching PATTERN;
# fails (printing LOG) if PID exits first or the time runs out.
wait_for_line() {
    local pid=$1 log=$2 pattern=$3 tries=$(($4 * 2))
    for _ in $(seq "$tries"); do
        grep -q "$pattern" "$log" && return 0
        if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; return 1; fi
        sleep 0.5
    done
    echo "demo: no '$pattern' in $log after $4 s"; cat "$log"; return 1
}

echo "== starting the demo inference server on 127.0.0.1:$PORT (loads the model: ~20-40 s)"
"$IP" demo --port "$PORT" > "$OUT/server.log" 2>&1 &
SRV_PID=$!
wait_for_line "$SRV_PID" "$OUT/server.log" '^inferprobe demo: serving' 120
curl -fsS "http://127.0.0.1:$PORT/health" > /dev/null \
    || { echo "demo: the server did not answer /health"; cat "$OUT/server.log"; exit 1; }
echo "   $(grep '^inferprobe demo: serving' "$OUT/server.log")"

echo "== attaching inferprobe for ${DURATION}s (compiles the BPF programs, a few seconds)"
# --locks: the demo's API layer and engine share a lock, as real servers do;
# the report then gives each request its mutex.wait.ratio. --network: write ->
# wire delay and TCP state of each token stream (cheap at the demo's token rate).
"$IP" record -p "$SRV_PID" -d "$DURATION" --locks --network -o "$OUT/demo.ipr" > "$OUT/record.log" 2>&1 &
REC_PID=$!
wait_for_line "$REC_PID" "$OUT/record.log" '^inferprobe: attached' 60
head -n 1 "$OUT/record.log"

# Closed-loop load stops sending at LOAD_S, then waits for the requests in
# flight (several seconds each with 8 streams on 2 cores): send for half the
# recording so every request is recorded whole.
LOAD_S=$(((DURATION + 1) / 2))
echo "== driving ${LOAD_S}s of load: $CONCURRENCY concurrent streaming requests, keep-alive"
"$IP" demo --load "$CONCURRENCY" --duration "$LOAD_S" --max-tokens 32 \
    --url "http://127.0.0.1:$PORT" --json "$OUT/client.json" | sed 's/^/   /'

wait "$REC_PID" || true
REC_PID=
tail -n 1 "$OUT/record.log"

echo "== report"
"$IP" report "$OUT/demo.ipr"
"$IP" report "$OUT/demo.ipr" --format json -o "$OUT/demo.json"
"$IP" report "$OUT/demo.ipr" -o "$OUT/report.html"
echo "HTML report: $OUT/report.html   JSON: $OUT/demo.json   recording: $OUT/demo.ipr   client's view: $OUT/client.json"
