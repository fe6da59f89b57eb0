#!/usr/bin/env bash
# Builds the CUPTI shim (probes/cupti/inferprobe_cupti.c) once, against the
# CUPTI and CUDA headers NVIDIA ships on PyPI (nvidia-cuda-cupti-cu12,
# nvidia-cuda-runtime-cu12; the runtime's headers include crt/host_defines.h,
# which only nvidia-cuda-nvcc-cu12 ships: its include/crt/ is all we take), and caches it outside the checkout with the
# libcupti.so it links to. No CUDA toolkit and no GPU are needed to build it.
#
#   build_cupti_shim.sh          build if the cache lacks this version and source; print the .so's path
#   build_cupti_shim.sh --path   print the built .so's path, build nothing (exit 1 when not built)
#
# Offline, against a CUDA already installed (a GPU machine with no registry,
# benchmarks/gpu_check.py): CUPTI_INCLUDE=<dir of cupti.h> CUPTI_LIB=<dir of
# libcupti.so.N> CUDA_INCLUDE=<dir of cuda.h and crt/> build_cupti_shim.sh
# builds against those (cache key "local-..."), downloading nothing.
#
# The result: $CUPTI_CACHE/<cuda version>-<source hash>/libinferprobe_cupti.so
# with libcupti.so.12 beside it, found through an $ORIGIN rpath, so the folder
# can move. `inferprobe gpu-attach` and the tests find it the same way
# (inferprobe.collector.binaries.cupti_shim). Idempotent: a second run prints the path.
set -euo pipefail

CUDA_WHEEL_VERSION="${CUDA_WHEEL_VERSION:-12.9.79}"
NVCC_WHEEL_VERSION="${NVCC_WHEEL_VERSION:-12.9.86}"  # the nvcc wheel of the same CUDA release
CUPTI_CACHE="${CUPTI_CACHE:-/var/cache/inferprobe/cupti-shim}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/probes/cupti/inferprobe_cupti.c"
PIP="${PIP:-$ROOT/.venv/bin/python -m pip}"
PYTHON="${PYTHON:-python3}"

LOCAL=0
[[ -n "${CUPTI_INCLUDE:-}" || -n "${CUPTI_LIB:-}" || -n "${CUDA_INCLUDE:-}" ]] && LOCAL=1
# The cache key holds the source's hash: an edited shim is rebuilt, not reused.
if ((LOCAL)); then
    key="local-$(cat "$SRC" "${CUPTI_INCLUDE:-}/cupti_version.h" 2>/dev/null | sha256sum | cut -c1-12)"
else
    key="$CUDA_WHEEL_VERSION-$(sha256sum "$SRC" | cut -c1-12)"
fi
OUT="$CUPTI_CACHE/$key"
SO="$OUT/libinferprobe_cupti.so"

say() { printf 'cupti-shim: %s\n' "$*"; }

if [[ "${1:-}" == --path ]]; then
    [[ -f "$SO" && -f "$OUT/.built" ]] || exit 1
    printf '%s\n' "$SO"
    exit 0
fi

if [[ -f "$SO" && -f "$OUT/.built" ]]; then
    say "cached at $SO"
    exit 0
fi

command -v cc >/dev/null || { printf 'cupti-shim: error: a C compiler (cc) is needed\n' >&2; exit 1; }
printf '#include <sys/sdt.h>\n' | cc -E -x c - >/dev/null 2>&1 || { printf 'cupti-shim: error: <sys/sdt.h> is missing (apt-get install systemtap-sdt-dev)\n' >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if ((LOCAL)); then
    for var in CUPTI_INCLUDE CUPTI_LIB CUDA_INCLUDE; do
        [[ -d "${!var:-}" ]] || { printf 'cupti-shim: error: %s must name a directory (got %q)\n' "$var" "${!var:-}" >&2; exit 1; }
    done
    lib="$(find "$CUPTI_LIB" -maxdepth 1 -name 'libcupti.so.[0-9]*' | sort | head -n 1)"
    [[ -n "$lib" ]] || { printf 'cupti-shim: error: no libcupti.so.N in %s\n' "$CUPTI_LIB" >&2; exit 1; }
    say "building against the CUPTI in $CUPTI_INCLUDE and $lib into $OUT"
    rm -rf "$OUT.tmp"
    mkdir -p "$OUT.tmp"
    soname="$(basename "$lib" | grep -o '^libcupti\.so\.[0-9]*')"
    cp -L "$lib" "$OUT.tmp/$soname"
    cc -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror \
        -I "$CUPTI_INCLUDE" -I "$CUDA_INCLUDE" -o "$OUT.tmp/libinferprobe_cupti.so" "$SRC" \
        "$OUT.tmp/$soname" -Wl,-rpath,'$ORIGIN' -Wl,--no-as-needed -lpthread -ldl
    printf '%s\n' "$key" >"$OUT.tmp/.built"
    rm -rf "$OUT"
    mv "$OUT.tmp" "$OUT"
    say "built $SO"
    exit 0
fi
say "building against nvidia-cuda-cupti-cu12 and nvidia-cuda-runtime-cu12 $CUDA_WHEEL_VERSION into $OUT"
$PIP download -q --no-deps -d "$work/wheels" \
    "nvidia-cuda-cupti-cu12==$CUDA_WHEEL_VERSION" "nvidia-cuda-runtime-cu12==$CUDA_WHEEL_VERSION"
for wheel in "$work"/wheels/*.whl; do
    "$PYTHON" -m zipfile -e "$wheel" "$work/x"
done
$PIP download -q --no-deps -d "$work/nvcc" "nvidia-cuda-nvcc-cu12==$NVCC_WHEEL_VERSION"
"$PYTHON" - "$work/nvcc" "$work/x" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("nvidia/cuda_nvcc/include/crt/")])
PY
cupti="$work/x/nvidia/cuda_cupti"
runtime="$work/x/nvidia/cuda_runtime"

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp"
cp -a "$cupti/lib/libcupti.so.12" "$OUT.tmp/"
# -fvisibility=hidden: only the entry points marked EXPORT are dynamic symbols.
cc -O2 -g -fPIC -shared -fvisibility=hidden -Wall -Wextra -Werror \
    -I "$cupti/include" -I "$runtime/include" -I "$work/x/nvidia/cuda_nvcc/include" \
    -o "$OUT.tmp/libinferprobe_cupti.so" "$SRC" \
    "$OUT.tmp/libcupti.so.12" -Wl,-rpath,'$ORIGIN' -Wl,--no-as-needed -lpthread -ldl
printf '%s\n' "$key" >"$OUT.tmp/.built"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
# Earlier builds (older sources) go: a process that still maps one keeps its inode.
find "$CUPTI_CACHE" -mindepth 1 -maxdepth 1 ! -name "$key" -exec rm -rf {} +
say "built $SO"
