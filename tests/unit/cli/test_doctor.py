"""`inferprobe doctor`'s pure helpers, and its help text."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from inferprobe.collector.attach import preflight
from inferprobe.collector.attach.preflight import Check

from tests.support.cli import run_doctor


def test_doctor_help_has_examples():
    result = run_doctor("--help")
    assert result.returncode == 0, result.stderr
    assert "Examples:" in result.stdout
    assert "--kernel-headers" in result.stdout


# ------------------------------------------------------------ pure helpers


STATUS_ROOT = """Name:\tpython3
Uid:\t0\t0\t0\t0
CapInh:\t0000000000000000
CapPrm:\t000001ffffffffff
CapEff:\t000001ffffffffff
CapBnd:\t000001ffffffffff
"""


def test_parse_cap_eff():
    cap_eff = preflight.parse_cap_eff(STATUS_ROOT)
    assert cap_eff == 0x1FFFFFFFFFF
    assert preflight.can_trace_with(cap_eff)
    assert preflight.parse_cap_eff("Name:\tx\n") is None


def test_capability_combinations():
    bpf_perfmon = (1 << preflight.CAP_BPF) | (1 << preflight.CAP_PERFMON)
    assert preflight.can_trace_with(bpf_perfmon)
    assert not preflight.can_trace_with(1 << preflight.CAP_BPF)
    assert preflight.can_trace_with(1 << preflight.CAP_SYS_ADMIN)
    assert not preflight.can_trace_with(0)
    status = STATUS_ROOT.replace("CapEff:\t000001ffffffffff", f"CapEff:\t{bpf_perfmon:016x}")
    assert preflight.parse_cap_eff(status) == bpf_perfmon


def test_headers_version_from_utsrelease(tmp_path: Path):
    generated = tmp_path / "linux-headers-9.9.9-1-amd64" / "include" / "generated"
    generated.mkdir(parents=True)
    (generated / "utsrelease.h").write_text('#define UTS_RELEASE "6.1.0-57-amd64"\n')
    assert preflight.headers_version(generated.parent.parent) == "6.1.0-57-amd64"


def test_headers_version_from_dir_name_and_symlink(tmp_path: Path):
    real = tmp_path / "linux-headers-6.1.0-57-amd64"
    real.mkdir()
    link = tmp_path / "build"
    link.symlink_to(real)
    assert preflight.headers_version(link) == "6.1.0-57-amd64"
    assert preflight.headers_version(tmp_path / "nothing-here") is None


def test_override_headers_reports_half_trees(tmp_path: Path, monkeypatch):
    common = tmp_path / "common"
    (common / "include" / "linux").mkdir(parents=True)
    (common / "include" / "linux" / "kconfig.h").write_text("")
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(common))
    check = preflight.check_kernel_headers()
    assert not check.ok
    assert str(common) in check.detail and "autoconf.h" in check.detail
    assert check.fix and "BCC_KERNEL_SOURCE" in check.fix

    (common / "include" / "generated").mkdir()
    (common / "include" / "generated" / "autoconf.h").write_text("")
    (common / "include" / "generated" / "utsrelease.h").write_text(
        f'#define UTS_RELEASE "{platform.release()}"\n')
    check = preflight.check_kernel_headers()
    assert check.ok, check.detail
    assert "matches the running kernel" in check.detail


def test_first_error_line_prefers_compiler_errors():
    noise = (
        "sh: 1: modprobe: not found\n"
        "<built-in>:1:10: fatal error: './include/linux/kconfig.h' file not found\n"
        "1 error generated.\n"
    )
    assert preflight.first_error_line(noise).startswith("<built-in>:1:10: fatal error:")
    assert preflight.first_error_line("") is None


def test_first_error_line_gives_the_verifier_reason_not_a_clang_warning():
    # what bcc printed for a program the verifier refused (this session's own mistake)
    log = (
        "warning: bpf/stream_fields.bpf.h:237:5: loop not unrolled: the optimizer was unable to "
        "perform the requested transformation\n"
        "bpf: Failed to load program: Permission denied\n"
        "0: (79) r6 = *(u64 *)(r1 +8)\n"
        "89: (79) r4 = *(u64 *)(r5 +1624)\n"
        "invalid access to map value, value_size=1688 off=1688 size=8\n"
        "R5 min value is outside of the allowed memory range\n"
        "processed 249849 insns (limit 1000000) max_states_per_insn 23 total_states 12015\n"
    )
    assert preflight.first_error_line(log) == (
        "bpf: Failed to load program: Permission denied "
        "(R5 min value is outside of the allowed memory range)")


def test_tracing_ready_ignores_optional_checks():
    checks = [Check("bcc", True, "ok"), Check("usdt", False, "no", None, required=False)]
    assert preflight.tracing_ready(checks)
    assert not preflight.tracing_ready([*checks, Check("tracefs", False, "no", "mount")])


def test_captured_native_output_catches_fd2():
    with preflight.captured_native_output() as box:
        os.write(2, b"noise from C\n")
    assert box == ["noise from C\n"]
