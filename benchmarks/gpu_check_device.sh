#!/usr/bin/env bash
# The GPU check as one prepared command for a lent GPU machine (docs/gpu.md, "Check on a real GPU").
#
#   here (once):  bash benchmarks/gpu_check_device.sh --prepare
#                 copies <sys/sdt.h> (the GPU image may lack systemtap-sdt-dev) into .device-carry/,
#                 which .git/info/exclude then ignores locally
#   there:        the device tool's run with command "bash benchmarks/gpu_check_device.sh",
#                 carry [".device-carry"], timeout_s 420; figures come back in $OUT/gpu_check.json
#                 and the log in $OUT/gpu_check.log
#
# What runs there: benchmarks/gpu_check.py --shim-only (the shim against torch.profiler: counts,
# kernel time within 5 %, the per-request join), plus the gpu-attach check through gdb or
# cuda-gdb when one is there. The uprobe check needs bcc, which that image has not.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CARRY="$ROOT/.device-carry"

if [[ "${1:-}" == --prepare ]]; then
    sdt="$(printf '#include <sys/sdt.h>\n' | cc -M -x c - | tr ' \\' '\n\n' | grep '/sys/sdt.h$' | head -n 1)"
    [[ -n "$sdt" ]] || { echo "gpu_check_device: no <sys/sdt.h> here either (apt-get install systemtap-sdt-dev)" >&2; exit 1; }
    mkdir -p "$CARRY/include/sys"
    cp "$sdt" "$(dirname "$sdt")/sdt-config.h" "$CARRY/include/sys/"
    grep -qxF '/.device-carry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.device-carry/' >>"$ROOT/.git/info/exclude"
    echo "gpu_check_device: prepared $CARRY"
    exit 0
fi

if ! printf '#include <sys/sdt.h>\n' | cc -E -x c - >/dev/null 2>&1; then
    export CPATH="$CARRY/include${CPATH:+:$CPATH}"
fi
gdb="$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null || true)"
out="${OUT:-/tmp}"
export PYTHONUNBUFFERED=1
nvidia-smi -L || true
set -o pipefail
python3 "$ROOT/benchmarks/gpu_check.py" --shim-only ${gdb:+--attach-gdb "$gdb"} --out "$out/gpu_check.json" \
    2>&1 | tee "$out/gpu_check.log"
