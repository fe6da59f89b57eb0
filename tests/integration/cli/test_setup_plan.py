"""`make demo` sets up only what the demo needs; `make test` adds the test backends.

The first `make demo` on a fresh machine used to install the test-only
backends too (an 850 MB Phoenix venv, Prometheus, Chromium): minutes the demo
never uses. scripts/setup.sh --plan prints what a run would install.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.paths import REPO

TEST_ONLY = {"prometheus", "chromium", "golang-go", "nodejs", "strace", "wrk", "openssl", "python3-bpfcc",
             "cmake", "ninja-build", "g++", "gdb", "nginx-light",
             # tests/programs/rustls_sse's compiler and crates
             "rustc-web", "cargo-web", "librust-tokio-rustls-dev", "librust-hyper-dev", "librust-tokio-dev",
             "librust-rustls-pemfile-dev", "librust-ureq-dev", "librust-futures-util-dev", "librust-libc-dev"}
# What builds the programs compiled ahead of time (scripts/build_bpf.sh): the demo needs them too.
BPF_BUILD = {"clang-14", "libbpf-dev", "bpftool"}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="scripts/setup.sh refuses to run without root")


def plan(*args: str) -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), *args, "--plan"],
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split(": ", 1) for line in out.splitlines())


@needs_root
def test_demo_setup_installs_no_test_backend():
    demo = plan("--demo")
    assert not TEST_ONLY & set(demo["apt"].split())
    assert "phoenix" not in demo
    # Nothing compiles BPF at run time: bcc is a test tool only, and no kernel headers are installed.
    assert "python3-bpfcc" not in demo["apt"].split()
    assert not any(pkg.startswith("linux-headers") for pkg in demo["apt"].split())
    assert BPF_BUILD <= set(demo["apt"].split())
    assert "bpf" in demo


@needs_root
def test_test_setup_installs_the_demo_set_and_the_backends():
    full, demo = plan(), plan("--demo")
    assert set(demo["apt"].split()) | TEST_ONLY == set(full["apt"].split())
    assert "phoenix" in full
    assert "llama-server" in full and "llama-server" not in demo
    assert "rust-programs" in full and "rust-programs" not in demo
