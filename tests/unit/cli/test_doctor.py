"""`inferprobe doctor`'s pure helpers, and its help text."""

from __future__ import annotations

from pathlib import Path

from inferprobe.collector.attach import preflight
from inferprobe.collector.attach.preflight import Check

from tests.support.cli import run_doctor


def test_doctor_help_has_examples():
    result = run_doctor("--help")
    assert result.returncode == 0, result.stderr
    assert "Examples:" in result.stdout
    assert "--btf" in result.stdout


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


def test_a_verifier_refusal_is_said_with_its_program_and_reason():
    # what libbpf prints, one warning per line, for a program the verifier refused
    from inferprobe.collector.attach.libbpf import _failure

    lines = [
        "libbpf: prog 'tcp_rcv_space_adjust': BPF program load failed: Permission denied",
        "libbpf: prog 'tcp_rcv_space_adjust': -- BEGIN PROG LOAD LOG --\n"
        "0: R1=ctx() R10=fp0\n"
        "119: (69) r3 = *(u16 *)(r3 +2)\n"
        "dereference of modified ctx ptr R3 off=26 disallowed\n"
        "processed 123 insns (limit 1000000) max_states_per_insn 0 total_states 8 peak_states 8\n"
        "-- END PROG LOAD LOG --",
        "libbpf: prog 'tcp_rcv_space_adjust': failed to load: -13",
        "libbpf: failed to load object 'bpf/build/sock.bpf.o'",
    ]
    assert str(_failure("the kernel refused sock.bpf.o", lines, 13)) == (
        "the kernel refused sock.bpf.o: the verifier refused program tcp_rcv_space_adjust: "
        "dereference of modified ctx ptr R3 off=26 disallowed (Permission denied)")


def test_a_failed_load_says_its_first_warning_and_libbpf_s_own_error_in_words():
    from inferprobe.collector.attach.libbpf import _failure

    lines = ["libbpf: failed to get EHDR from /tmp/bad.btf", "libbpf: failed to parse target BTF: -4001",
             "libbpf: failed to load object 'bpf/build/sock.bpf.o'"]
    assert str(_failure("the kernel refused sock.bpf.o", lines, 4001)) == (
        "the kernel refused sock.bpf.o: failed to get EHDR from /tmp/bad.btf (BPF object format invalid)")


def test_a_btf_file_given_for_a_kernel_without_btf_must_exist(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(preflight, "BTF_VMLINUX", str(tmp_path / "no-vmlinux"))
    monkeypatch.delenv("INFERPROBE_BTF", raising=False)
    check = preflight.check_btf()
    assert not check.ok and check.required
    assert "exposes no BTF" in check.detail and check.fix and "--btf" in check.fix and "BTFHub" in check.fix
    monkeypatch.setenv("INFERPROBE_BTF", str(tmp_path / "missing.btf"))
    check = preflight.check_btf()
    assert not check.ok and "missing.btf" in check.detail and "does not exist" in check.detail
    (tmp_path / "given.btf").write_bytes(b"")
    monkeypatch.setenv("INFERPROBE_BTF", str(tmp_path / "given.btf"))
    check = preflight.check_btf()
    assert check.ok and "given.btf" in check.detail and "hash map" in check.detail


def test_tracing_ready_ignores_optional_checks():
    checks = [Check("libbpf", True, "ok"), Check("usdt", False, "no", None, required=False)]
    assert preflight.tracing_ready(checks)
    assert not preflight.tracing_ready([*checks, Check("tracefs", False, "no", "mount")])
