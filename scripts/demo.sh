#!/usr/bin/env bash
# The README's main job on a bundled server: start the test streaming server,
# record it with inferprobe while a load client drives it, print the report.
# Run as root after scripts/setup.sh (make demo does both).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${OUT:-out}
DURATION=${DURATION:-10}
mkdir -p "$OUT"

cleanup() {
    [[ -n "${REC_PID:-}" ]] && kill "$REC_PID" 2>/dev/null || true
    [[ -n "${SRV_PID:-}" ]] && kill "$SRV_PID" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

echo "== starting the test streaming server"
coproc SRV { exec "$PY" tests/servers/sse_server.py --host 127.0.0.1 --port 0 --log "$OUT/server_log.jsonl"; }
SRV_PID=$SRV_PID
read -r line <&"${SRV[0]}"
PORT=${line##*:}
echo "   $line (pid $SRV_PID)"

echo "== attaching inferprobe (compiles the BPF programs, a few seconds)"
: > "$OUT/record.log"
.venv/bin/inferprobe record -p "$SRV_PID" -o "$OUT/demo.ipr" > "$OUT/record.log" 2>&1 &
REC_PID=$!
for _ in $(seq 120); do
    grep -q '^inferprobe: attached' "$OUT/record.log" && break
    if ! kill -0 "$REC_PID" 2>/dev/null; then cat "$OUT/record.log"; exit 1; fi
    sleep 0.5
done
cat "$OUT/record.log"

echo "== driving ${DURATION}s of load: 16 concurrent streaming requests, keep-alive"
"$PY" tests/servers/sse_client.py --port "$PORT" --connections 16 --duration "$DURATION" \
    --max-tokens 16 --interval-ms 5 > "$OUT/client_summary.json"
echo "   client's own view: $(tr -d '\n ' < "$OUT/client_summary.json" | cut -c1-200)..."

kill -TERM "$REC_PID"
wait "$REC_PID" || true
REC_PID=
tail -n 1 "$OUT/record.log"

echo "== report"
.venv/bin/inferprobe report "$OUT/demo.ipr"
.venv/bin/inferprobe report "$OUT/demo.ipr" --format json -o "$OUT/demo.json"
echo "JSON report: $OUT/demo.json   recording: $OUT/demo.ipr"
