"""gpu-attach's checks that need no process: Yama's ptrace scope, and reading what gdb printed.

(The attach itself, into a real process through gdb, is tests/integration/gpu/test_cupti_shim.py.)"""

from __future__ import annotations

import pytest

from inferprobe.collector.attach import cupti_attach
from inferprobe.collector.binaries.cupti_shim import ShimStatus
from inferprobe.collector.errors import EnvironmentProblem, TargetProblem

ROOT_CAPS = "CapEff:\t000001ffffffffff\n"
NO_CAPS = "CapEff:\t0000000000000000\n"


def scope(tmp_path, value: str):
    f = tmp_path / "ptrace_scope"
    f.write_text(value)
    return f


def test_ptrace_scope_3_refuses_everyone_and_points_at_start_up_injection(tmp_path):
    with pytest.raises(EnvironmentProblem) as err:
        cupti_attach.check_ptrace(42, scope(tmp_path, "3\n"), ROOT_CAPS)
    assert str(err.value) == (
        "ptrace is disabled on this host (kernel.yama.ptrace_scope=3), so no debugger can load the CUPTI "
        "shim into pid 42: start the server with CUDA_INJECTION64_PATH instead (docs/gpu.md)")


@pytest.mark.parametrize("value", ["1", "2"])
def test_restricted_ptrace_needs_cap_sys_ptrace(tmp_path, value):
    with pytest.raises(EnvironmentProblem, match=f"ptrace_scope={value} needs CAP_SYS_PTRACE"):
        cupti_attach.check_ptrace(42, scope(tmp_path, value), NO_CAPS)
    cupti_attach.check_ptrace(42, scope(tmp_path, value), ROOT_CAPS)  # root: allowed


def test_no_yama_or_scope_0_leaves_it_to_the_kernel(tmp_path):
    cupti_attach.check_ptrace(42, tmp_path / "absent", NO_CAPS)
    cupti_attach.check_ptrace(42, scope(tmp_path, "0"), NO_CAPS)


def test_the_shims_reply_is_read_from_gdbs_output():
    out = ("[Thread debugging using libthread_db enabled]\ninferprobe-handle 0x55d0\n"
           "[New Thread 0x7f (LWP 9)]\n"
           "inferprobe-status 1 CUPTI is recording kernel, copy and memset activity in pid 42\n")
    reply = cupti_attach._parse_reply(42, out, "/x/libinferprobe_cupti.so")
    assert reply.status == ShimStatus.COLLECTING
    assert reply.sentence == "CUPTI is recording kernel, copy and memset activity in pid 42"


def test_a_failed_dlopen_and_a_failed_call_are_one_sentence_each():
    with pytest.raises(TargetProblem) as err:
        cupti_attach._parse_reply(
            42, "inferprobe-handle 0x0\ninferprobe-dlerror libcupti.so.12: cannot open\n", "/x.so")
    assert str(err.value) == "pid 42 could not load the CUPTI shim: libcupti.so.12: cannot open"
    with pytest.raises(TargetProblem, match=r"^gdb could not call into pid 42 \(No symbol table"):
        cupti_attach._parse_reply(42, "No symbol table is loaded.\n", "/x.so")
