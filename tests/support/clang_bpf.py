"""BPF programs a test writes for itself, built by clang the way scripts/build_bpf.sh
builds ours, and loaded with inferprobe's libbpf binding.

Why: a few tests check inferprobe against a tracer of their own (an independent
reading of Go's registers, of USDT arguments). Those tracers were bcc programs,
and bcc compiles against the running kernel's headers at every load; set-up no
longer provides headers (the product needs none since issue 36), so they are
CO-RE programs now, built against bpf/build/vmlinux.h. A program appends its
records to an array map (`records`, `count`: see RECORDS) that the test reads
back once the workload is done: no ring to poll. The benchmarks' own small
programs (bench_probes' counter, bench_syscalls' do-nothing programs) are built
here too.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

from inferprobe.collector.attach.libbpf import BpfObject

from tests.support.paths import REPO

# What every test program starts with: the kernel's types and libbpf's helpers.
PRELUDE = r"""
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "GPL";
"""

# The maps and the helper that append records, put where the source says
# %RECORDS% (after its struct record).
RECORDS = r"""
#define RECORDS_MAX 4096
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, RECORDS_MAX);
    __type(key, u32);
    __type(value, struct record);
} records SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u32);
} count SEC(".maps");

/* The next free record, in the order the probes fired (NULL once full). */
static __always_inline struct record *next_record(void)
{
    u32 zero = 0;
    u32 *n = bpf_map_lookup_elem(&count, &zero);
    if (!n)
        return 0;
    u32 at = __sync_fetch_and_add(n, 1);
    return bpf_map_lookup_elem(&records, &at);
}
"""


def build(source: str, out_dir: Path, name: str = "test", flags: tuple[str, ...] = ()) -> BpfObject:
    """Compiles PRELUDE + `source` and opens it; the caller loads and attaches
    it. A source that keeps records defines struct record, then says `%RECORDS%`."""
    clang = shutil.which("clang-14") or shutil.which("clang")
    if clang is None:
        raise RuntimeError("clang is missing (make setup installs clang-14)")
    vmlinux = REPO / "bpf" / "build" / "vmlinux.h"
    if not vmlinux.exists():
        raise RuntimeError(f"{vmlinux} is missing: run scripts/build_bpf.sh (make setup does)")
    multiarch = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True).stdout.strip()
    obj = out_dir / f"{name}.bpf.o"
    subprocess.run([clang, "-g", "-O2", "-target", "bpf", "-D__TARGET_ARCH_x86", "-Wall", "-Werror",
                    "-mcpu=v3",   # the atomic add that returns its old value (next_record)
                    f"-I{vmlinux.parent}", f"-I/usr/include/{multiarch}", *flags,
                    "-x", "c", "-", "-c", "-o", str(obj)],
                   input=PRELUDE + source.replace("%RECORDS%", RECORDS), text=True, check=True)
    return BpfObject(obj)


def read_records(bpf: BpfObject) -> list:
    """The records the programs appended, oldest first."""
    n = int(bpf["count"][ctypes.c_uint32(0)].value)
    table = bpf["records"]
    return [table[ctypes.c_uint32(i)] for i in range(min(n, table.max_entries))]
