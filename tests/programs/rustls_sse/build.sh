#!/usr/bin/env bash
# Builds the rustls test programs (Cargo.toml here) offline, from the crates
# Debian packages (/usr/share/cargo/registry), with symbols kept, into a cache
# folder keyed by these sources; prints that folder. Exit 3, saying why, where
# Rust or the crates are not installed (make setup installs them).
# Usage: build.sh   (RUST_PROGRAMS_DIR overrides /var/cache/inferprobe/rust-programs)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${RUST_PROGRAMS_DIR:-/var/cache/inferprobe/rust-programs}
REGISTRY=/usr/share/cargo/registry
key=$(cd "$HERE" && cat Cargo.toml build.sh $(find src -name '*.rs' | sort) | sha256sum | cut -c1-16)
out="$CACHE/$key"
if [[ -x $out/rustls_sse_server && -x $out/rustls_sse_client ]]; then
    echo "$out"
    exit 0
fi
command -v cargo >/dev/null || { echo "cargo is not installed (Debian's cargo-web)" >&2; exit 3; }
compgen -G "$REGISTRY/rustls-0.*" >/dev/null \
    || { echo "Debian's Rust crates are not installed (librust-tokio-rustls-dev and the others)" >&2; exit 3; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy: cargo writes Cargo.lock beside Cargo.toml, and the versions are whatever Debian ships.
cp -r "$HERE/Cargo.toml" "$HERE/src" "$work/"
mkdir -p "$work/home"
cat >"$work/home/config.toml" <<CONFIG
[source.crates-io]
replace-with = "debian"
[source.debian]
directory = "$REGISTRY"
[net]
offline = true
CONFIG
CARGO_HOME="$work/home" CARGO_TARGET_DIR="$work/target" cargo build --quiet --release --manifest-path "$work/Cargo.toml"
mkdir -p "$out.part"
cp "$work/target/release/rustls_sse_server" "$work/target/release/rustls_sse_client" "$out.part/"
rm -rf "$out" && mv "$out.part" "$out"
echo "$out"
