"""Attaches a uprobe through tracefs over an event a killed tracer of the same pid left behind.

Run without CAP_SYS_ADMIN: Linux 6.16+ then refuses perf uprobes, and
collector/attach/libbpf.py makes the probe a tracefs event instead
(collector/attach/tracefs_uprobes.py), named after the file, the offset and the
pid, in the group of the tracer's pid. Before attaching, this process writes an
entry of exactly that name itself, as an agent killed with SIGKILL leaves one
behind for the next agent with its pid (pid 1 of a restarted container). It then attaches a uprobe on
libc's getpid() with a small BPF program built here with clang (as
scripts/build_bpf.sh builds ours), calls getpid() CALLS times and prints one
JSON line: whether the stale entry was there before, whether the attach went
through tracefs (the kernel then refuses to remove the event of that name: a
probe uses it), the hits the probe counted, and whether the entry is gone
after detaching. The line is removed on every way out.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from elftools.elf.elffile import ELFFile

from inferprobe.collector.attach import tracefs_uprobes
from inferprobe.collector.attach.built_objects import BPF_DIR
from inferprobe.collector.attach.libbpf import BpfObject
from inferprobe.collector.attach.uprobe_attach import _file_offset

CALLS = 100
PROGRAM = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "GPL";
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} hits SEC(".maps");
SEC("uprobe") int on_getpid(void *ctx)
{
    u32 zero = 0;
    u64 *n = bpf_map_lookup_elem(&hits, &zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}
"""


def entries(tracefs: Path) -> list[str]:
    with open(tracefs / "uprobe_events") as events:
        return [line.split()[0].split("/", 1)[1] for line in events if line.strip()]


def write_line(tracefs: Path, line: str) -> bool:
    """Writes one line to uprobe_events; False where the kernel refused it (a removal of an event
    a probe uses: EBUSY; of one that is not there: ENOENT)."""
    # O_APPEND, not open("a"): tracefs refuses the seek
    events = os.open(tracefs / "uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(events, line.encode())
        return True
    except OSError:
        return False
    finally:
        os.close(events)


def libc_getpid() -> tuple[str, int]:
    """libc's path as this process maps it, and getpid's file offset in it."""
    path = next(line.split()[-1] for line in open("/proc/self/maps") if "/libc.so" in line)
    with open(path, "rb") as f:
        symbol = ELFFile(f).get_section_by_name(".dynsym").get_symbol_by_name("getpid")[0]
        return path, _file_offset(path, symbol["st_value"])


def build(directory: Path) -> Path:
    clang = shutil.which("clang-14") or shutil.which("clang")
    if clang is None:
        sys.exit("clang is missing (apt-get install clang-14)")
    source, obj = directory / "count.bpf.c", directory / "count.bpf.o"
    source.write_text(PROGRAM)
    subprocess.run([clang, "-g", "-O2", "-target", "bpf", f"-I{BPF_DIR / 'build'}", "-c", str(source),
                    "-o", str(obj)], check=True)
    return obj


def main() -> None:
    tracefs = tracefs_uprobes.tracefs_dir()
    pid = os.getpid()
    path, offset = libc_getpid()
    name = tracefs_uprobes.short_event_name(False, path, offset, pid)
    event = f"{tracefs_uprobes.owner_group()}/{name}"
    write_line(tracefs, f"p:{event} {path}:0x{offset:x}\n")   # what a killed tracer of this pid left
    try:
        stale_before = name in entries(tracefs)
        with tempfile.TemporaryDirectory() as directory:
            obj = BpfObject(build(Path(directory)))
            try:
                obj.load()
                link = obj.attach_uprobe("on_getpid", pid, path, offset)
                # Through tracefs the probe uses the event of that name, and the kernel refuses
                # to remove it; on the perf path the stale line is unused, and goes.
                through_tracefs = name in entries(tracefs) and not write_line(tracefs, f"-:{event}\n")
                libc = ctypes.CDLL(None)
                for _ in range(CALLS):
                    libc.getpid()
                hits = obj["hits"][ctypes.c_uint32(0)].value
                link.destroy()
            finally:
                obj.close()
        print(json.dumps({"stale_before": stale_before, "through_tracefs": through_tracefs, "hits": hits,
                          "calls": CALLS, "gone_after": name not in entries(tracefs)}))
    finally:
        write_line(tracefs, f"-:{event}\n")


if __name__ == "__main__":
    main()
