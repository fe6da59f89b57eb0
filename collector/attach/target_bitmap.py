"""The kernel's target bitmap (bpf/common.bpf.h): one bit per pid the programs
trace, set for the targets, and by the kernel for what they fork."""

from __future__ import annotations

import ctypes
import errno

from inferprobe.collector.attach import libbpf_library as libbpf


def add_targets(bpf, pids: list[int]) -> None:
    """Sets the pids' bits in the kernel's target bitmap (common.bpf.h), which
    covers every pid a 64-bit kernel can hand out (PID_MAX_LIMIT, 1 << 22)."""
    _set_target_bits(bpf, pids, True)


def remove_targets(bpf, pids: list[int]) -> None:
    """Clears the pids' bits: the programs then treat them as any other process."""
    _set_target_bits(bpf, pids, False)


def _set_target_bits(bpf, pids: list[int], on: bool) -> None:
    bitmap = bpf[b"targets"]
    for pid in pids:
        word = ctypes.c_int(pid // 64)
        value, bit = bitmap[word].value, 1 << (pid % 64)
        bitmap[word] = ctypes.c_uint64(value | bit if on else value & ~bit)


def target_pids(bpf) -> list[int]:
    """Every pid set in the kernel's target bitmap: the targets, and the
    processes and threads the kernel saw them fork since."""
    bitmap = bpf[b"targets"]
    words = bitmap.max_entries
    keys = (ctypes.c_uint32 * words)()
    values = (ctypes.c_uint64 * words)()
    count = ctypes.c_uint32(words)
    batch = ctypes.c_uint32(0)
    # One BPF_MAP_LOOKUP_BATCH for the whole 512 KiB, not 65536 lookups: this
    # runs about once a second while recording.
    if libbpf.library().bpf_map_lookup_batch(bitmap.map_fd, None, ctypes.byref(batch), keys, values,
                                             ctypes.byref(count), None) != 0 \
            and ctypes.get_errno() != errno.ENOENT:
        raise OSError(ctypes.get_errno(), "reading the target bitmap failed")
    return [index * 64 + bit
            for index, word in enumerate(memoryview(values).cast("B").cast("Q")[:count.value]) if word
            for bit in range(64) if word >> bit & 1]
