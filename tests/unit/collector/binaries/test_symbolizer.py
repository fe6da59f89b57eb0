"""The one symbolizer (collector/binaries/symbolizer.py) on this very process: no root needed."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from inferprobe.collector.binaries import symbolizer
from inferprobe.collector.binaries.symbolizer import Symbolizer
from inferprobe.collector.processes.proc_maps import parse_maps, read_maps

MAPS = """\
7f0000000000-7f0000001000 r--p 00000000 08:01 1234   /usr/lib/libfoo.so
7f0000001000-7f0000003000 r-xp 00001000 08:01 1234   /usr/lib/libfoo.so
7e0000000000-7e0000001000 rwxp 00000000 00:00 0
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0      [vdso]
"""


def _libc_address(name: str) -> int:
    return ctypes.cast(getattr(ctypes.CDLL("libc.so.6"), name), ctypes.c_void_p).value


def test_maps_are_sorted_with_their_permissions_and_file_only_when_read_for_a_pid():
    maps = parse_maps(MAPS)
    assert [(m.start, m.executable, m.short_name) for m in maps] == [
        (0x7E0000000000, True, "[anon]"), (0x7F0000000000, False, "libfoo.so"),
        (0x7F0000001000, True, "libfoo.so"), (0x7FFD00000000, True, "[vdso]")]
    assert maps[2].offset == 0x1000 and maps[2].is_file and not maps[0].is_file
    own = read_maps(os.getpid())
    assert own and all(m.is_file for m in own)


def test_a_function_is_named_the_same_for_flame_graphs_and_lock_waits():
    pid = os.getpid()
    sym = Symbolizer()
    sym.remember_process(pid, read_files=False)
    for name in ("getpid", "pthread_mutex_lock"):
        addr = _libc_address(name)
        assert sym.user_frame(pid, addr) == name
        inside = sym.code_frame(pid, addr + 3)
        assert (inside.module, inside.function, inside.offset) == ("libc.so.6", name, 3)


def test_addresses_outside_any_file_keep_what_is_known_of_them():
    sym = Symbolizer()
    sym.remember_process(os.getpid())
    assert sym.code_frame(os.getpid(), 0x10).as_dict() == {
        "addr": 0x10, "module": "?", "function": "[unknown]", "offset": 0, "after_call": False}
    assert sym.user_frame(os.getpid(), 0x10) == "[unknown] [anon]+0x10"
    assert sym.user_frame(1 << 30, 0x10) == "[unknown] 0x10"  # a pid never remembered


GETPID_ADDRESS = ("import ctypes, sys; "
                  "print(ctypes.cast(ctypes.CDLL('libc.so.6').getpid, ctypes.c_void_p).value, flush=True); "
                  "sys.stdin.read()")


def test_an_exited_process_still_resolves_from_what_was_remembered():
    child = subprocess.Popen([sys.executable, "-c", GETPID_ADDRESS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    addr = int(child.stdout.readline())
    sym = Symbolizer()
    sym.remember_process(child.pid)
    child.communicate("")
    sym.remember_process(child.pid)  # gone: what was read before stays
    assert sym.user_frame(child.pid, addr) == "getpid"
    assert sym.code_frame(child.pid, addr).function == "getpid"


def test_return_addresses_follow_a_call_instruction():
    after = symbolizer._is_after_call
    assert after(bytes.fromhex("90 e8 10 20 30 40"))  # call rel32
    assert after(bytes.fromhex("90 90 ff d0"))  # call rax
    assert after(bytes.fromhex("ff 15 00 10 00 00"))  # call [rip+0x1000]
    assert after(bytes.fromhex("41 ff d3"))  # call r11
    assert not after(bytes.fromhex("90 90 ff e0"))  # jmp rax
    assert not after(bytes.fromhex("48 89 c7"))  # mov rdi, rax
    assert not after(b"")


def test_a_perf_map_names_the_jit_regions_a_runtime_wrote_and_nothing_outside_them():
    # The lines CPython's perf trampoline (python -X perf) and V8 write to /tmp/perf-PID.map:
    # "START SIZE name", hex without 0x, in any order; a name may hold spaces.
    perf_map = symbolizer.PerfMap.parse(
        "7f0000002000 40 py::handler:/srv/app.py\n"
        "7f0000001000 100 py::step:/srv/engine.py\n"
        "not a line\n"
        "7f0000003000 10 LazyCompile:~onRequest server.js:12\n")
    assert perf_map.lookup(0x7F0000001000) == "py::step:/srv/engine.py"
    assert perf_map.lookup(0x7F00000010FF) == "py::step:/srv/engine.py"
    assert perf_map.lookup(0x7F0000001100) is None  # the region's end is past it
    assert perf_map.lookup(0x7F000000203F) == "py::handler:/srv/app.py"
    assert perf_map.lookup(0x7F0000003004) == "LazyCompile:~onRequest server.js:12"
    assert perf_map.lookup(0x7F0000000FFF) is None


def test_exited_processes_past_the_bound_are_forgotten_and_live_ones_kept(monkeypatch):
    sym = symbolizer
    monkeypatch.setattr(sym, "MAX_PROCESSES", 3)
    live = {os.getpid(), 2}
    s = sym.Symbolizer(alive=lambda pid: pid in live)
    for pid in (1, 2, 3):
        s.processes[pid] = sym.ProcessInfo(pid, "x", "", [])
        s._tables[(pid, "/lib/x.so")] = None
    s.remember_process(os.getpid(), read_files=False)
    assert set(s.processes) == {2, 3, os.getpid()} and s.processes_evicted == 1
    assert (1, "/lib/x.so") not in s._tables and (3, "/lib/x.so") in s._tables
    assert s.user_frame(1, 0x1000).startswith("[unknown]")
