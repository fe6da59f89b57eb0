"""The ctypes binding to libbpf (collector/attach/libbpf.py) against the real kernel.

What a built set does with it end to end is test_usdt_set.py; this checks the
binding's own promises: a read-only global written before load is what the
kernel holds after it, a reused map is the map the kernel's programs use,
and each refusal is one sentence that says what and why.
"""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from inferprobe.collector.attach.built_objects import built_object
from inferprobe.collector.attach.libbpf import BpfObject, LibbpfError, map_id_of_fd

from tests.support.kernel import needs_root

pytestmark = [pytest.mark.bpf, needs_root]


def test_a_constant_written_before_load_is_what_the_kernel_holds():
    core = BpfObject(built_object("usdt.bpf.o"))
    try:
        core.set_constant("ringbuf_wakeup_bytes", 123_456_789_012)
        core.load()
        held = bytes(core[".rodata"][0])   # the kernel's copy: one value, the whole section
        assert (123_456_789_012).to_bytes(8, "little") in held
    finally:
        core.close()


def test_a_reused_map_is_the_one_the_loaded_object_uses():
    # A ring buffer made here, as the sockets set's object makes the shared ring (a CDLL of our
    # own: the binding's declared signatures stay as they are).
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    lib.bpf_map_create.restype = ctypes.c_int
    lib.bpf_map_create.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                   ctypes.c_uint32, ctypes.c_void_p]
    bpf_map_type_ringbuf = 27
    ring = lib.bpf_map_create(bpf_map_type_ringbuf, b"events", 0, 0, 64 * 4096, None)
    assert ring >= 0, os.strerror(ctypes.get_errno())
    core = BpfObject(built_object("usdt.bpf.o"))
    try:
        core.reuse_map("events", ring)
        core.set_max_entries("events", 64 * 4096)   # the size it was made with: nothing to do
        with pytest.raises(LibbpfError, match="made with 262144 entries by an object loaded before"):
            core.set_max_entries("events", 128 * 4096)
        core.load()
        assert core.map_id("events") == map_id_of_fd(ring)
        assert core.map_id("counters") != map_id_of_fd(ring)
    finally:
        core.close()
        os.close(ring)


def test_refusals_are_one_sentence_naming_what_and_why(tmp_path):
    with pytest.raises(LibbpfError, match=r"could not open .*not-there\.bpf\.o: .*No such file"):
        BpfObject(tmp_path / "not-there.bpf.o")
    core = BpfObject(built_object("usdt.bpf.o"))
    try:
        with pytest.raises(LibbpfError, match="has no read-only global nope"):
            core.set_constant("nope", 1)
        core.load()
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            with pytest.raises(LibbpfError) as refused:
                core.attach_usdt("usdt_probe", sleeper.pid, "/bin/sleep", "inferprobe", "request_start", 1)
        finally:
            sleeper.kill()
            sleeper.wait()
        message = str(refused.value)
        assert message.startswith("libbpf could not attach the USDT probe inferprobe:request_start "
                                  f"of pid {sleeper.pid} (/bin/sleep): ")
        assert "\n" not in message
    finally:
        core.close()


def test_sets_naming_the_same_map_share_one_and_read_it_with_their_own_types():
    """profile, offcpu and locks each define bpf/python_stacks.bpf.h's maps: the loader makes
    them one map, and each set reads it typed from its own object's BTF (a reused map's type
    ids belong to the object that made it). A CPython burner fills it while all three run."""
    import sys
    import time
    from pathlib import Path

    from inferprobe.collector.attach.loader import load_tracer

    burner = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parents[3] / "programs"
                                                    / "python_burn.py")], stdout=subprocess.PIPE)
    try:
        time.sleep(0.5)   # its interpreter up, so the sets find a CPython target
        tracer = load_tracer([burner.pid], sets=("locks", "profile", "offcpu"), ringbuf_pages=64)
        try:
            sets = [tracer.active[name] for name in ("locks", "profile", "offcpu")]
            assert len({s.core.map_id("python_stacks") for s in sets}) == 1
            assert len({s.core.map_id("events") for s in sets}) == 1
            time.sleep(1.5)
            for s in sets:   # the same entries, typed by each object's own BTF
                entries = s.core["python_stacks"].items()
                assert entries and all(int(entry.depth) > 0 for _, entry in entries)
            snapshots = tracer.snapshots()
        finally:
            tracer.close()
    finally:
        burner.terminate()
        burner.wait(timeout=10)
    assert snapshots["profile"]["counters"]["python_stacks"] > 0
    frames = {f for stack in snapshots["profile"]["stacks"] for f in stack["frames"]}
    assert any("burn_" in frame for frame in frames), sorted(frames)[:20]


def test_programs_loaded_apart_share_the_object_s_maps_and_settings():
    """load_apart verifies left-out programs in copies of the object, on threads at once
    (the sockets set's chain): each copy must work on the object's own maps, with its settings."""
    from inferprobe.collector.attach.probe_sets.sockets import CLASSIFIER_PROGRAMS

    core = BpfObject(built_object("sock_hash.bpf.o"))
    try:
        core.set_constant("host_wide_on", 1)
        for program in core.programs():
            if program in CLASSIFIER_PROGRAMS or program.endswith("_tls") or program.startswith("tls_"):
                core.set_autoload(program, False)
        core.load()
        holders = core.load_apart([["scan_body", "classify_request"], ["h2_frames"]])
        assert set(holders) == {"scan_body", "classify_request", "h2_frames"}
        assert len({id(part) for part in holders.values()}) == 2 and len(core.parts) == 2
        for program, part in holders.items():
            assert part.program_fd(program) >= 0
            assert part.constants == core.constants == {"host_wide_on": 1}
            for map_name in ("events", "socks", "scratch_area", "classifiers"):
                assert map_id_of_fd(part.map_fd(map_name)) == core.map_id(map_name)
        with pytest.raises(LibbpfError, match="not loaded"):
            core.program_fd("scan_body")   # left to the copies
        # In the array, a copy's program outlives the copy: the array holds it.
        core["classifiers"][ctypes.c_uint32(0)] = ctypes.c_uint32(holders["classify_request"].program_fd(
            "classify_request"))
        core.close_parts()
        assert not core.parts
        assert core["classifiers"].lookup(ctypes.c_uint32(0)) is not None
    finally:
        core.close()
