#!/usr/bin/env bash
# Builds the BPF programs that are compiled ahead of time (CO-RE) into bpf/build/.
#
# clang compiles each source once, against a vmlinux.h that bpftool dumps from
# this kernel's BTF; libbpf relocates the kernel-type accesses for whichever
# kernel loads the object later (CO-RE), so the objects travel. Rerun after
# changing bpf/'s sources or headers: it rebuilds only what is older than its inputs.
#
# Needs clang (14 or newer), libbpf's headers (libbpf-dev) and bpftool, at build
# time only. Usage: scripts/build_bpf.sh [--clean]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/bpf"
OUT="$SRC/build"
# Every object: "<object name>[:<source name> <clang flags>]". The socket set's
# source is built twice (bpf/sock.bpf.c says why): with its pending I/O in
# task-local storage and its scans on bpf_loop (Linux 5.17+), and with a hash
# and bounded loops for older kernels.
OBJECTS=(
    "sock:sock -DPENDING_IN_TASK_STORAGE -DHAVE_BPF_LOOP"
    "sock_hash:sock"
    usdt llama profile offcpu locks gpu
)

die() { printf 'build_bpf: error: %s\n' "$*" >&2; exit 1; }

[[ "${1:-}" == --clean ]] && rm -rf "$OUT"
CLANG="$(command -v clang-14 || command -v clang || true)"
[[ -n "$CLANG" ]] || die "clang is missing (apt-get install clang-14)"
[[ -f /usr/include/bpf/bpf_helpers.h ]] || die "libbpf's headers are missing (apt-get install libbpf-dev)"
case "$(uname -m)" in
    x86_64) arch=x86 ;;
    aarch64) arch=arm64 ;;
    *) die "no BPF target arch known for $(uname -m)" ;;
esac
mkdir -p "$OUT"

# vmlinux.h: every kernel type, from the BTF of the kernel building it.
if [[ ! -s "$OUT/vmlinux.h" ]]; then
    [[ -r /sys/kernel/btf/vmlinux ]] || die "this kernel exposes no BTF (/sys/kernel/btf/vmlinux) to build against"
    command -v bpftool >/dev/null || die "bpftool is missing (apt-get install bpftool)"
    bpftool btf dump file /sys/kernel/btf/vmlinux format c > "$OUT/vmlinux.h.tmp"
    mv "$OUT/vmlinux.h.tmp" "$OUT/vmlinux.h"
fi

# <asm/...> headers (libbpf's usdt.bpf.h includes errno.h) live under the multiarch dir.
multiarch="$(gcc -print-multiarch 2>/dev/null || printf '%s-linux-gnu' "$(uname -m)")"
for entry in "${OBJECTS[@]}"; do
    name="${entry%%:*}"
    spec="${entry#*:}"
    [[ "$entry" == *:* ]] || spec="$name"
    source="${spec%% *}"
    flags=()
    [[ "$spec" == *" "* ]] && read -r -a flags <<< "${spec#* }"
    obj="$OUT/$name.bpf.o"
    # Rebuilt when any source or header under bpf/ (sock.bpf.c includes .c parts and
    # bpf/protocols/) or this script is newer.
    if [[ -f "$obj" ]] && [[ -z "$(find "$SRC" -path "$OUT" -prune -o \( -name '*.h' -o -name '*.bpf.c' \) -newer "$obj" -print)" ]] \
        && [[ ! "${BASH_SOURCE[0]}" -nt "$obj" ]]; then
        continue
    fi
    # -Wno-pass-failed: a loop clang cannot unroll stays a bounded loop (Linux 5.3+ verifies those).
    "$CLANG" -g -O2 -target bpf -D__TARGET_ARCH_"$arch" -Wall -Werror -Wno-pass-failed "${flags[@]}" \
        -I"$OUT" -I"$SRC" ${multiarch:+-I/usr/include/$multiarch} \
        -c "$SRC/$source.bpf.c" -o "$obj.tmp"
    mv "$obj.tmp" "$obj"
    printf 'build_bpf: built %s\n' "${obj#"$ROOT"/}"
done
