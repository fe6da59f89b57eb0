"""Where in a small C function a uprobe costs least: its first emulated instruction.

A uprobe replaces an instruction with a breakpoint. The x86-64 kernel
emulates a few instructions at the breakpoint (jumps, conditional jumps,
calls); any other it executes out of line with a single step, a second
trap. On the 2-vCPU VM these notes were measured on, a probe on glibc's
sem_post entry (a mov) cost 9 µs a hit, the same probe on its first
conditional jump 0.46 µs (docs/locks.md). CPython calls sem_post and
sem_trywait at every threading.Lock release and acquire, so that factor
is the locks set's cost on a Python server.

probe_offset() walks the straight-line start of a function and returns the
offset of its first conditional or direct jump, when every instruction before
it is one of a few plain forms (mov, test, cmp, xor) that leave rdi (the
first argument, which the probes read) and rsp (where the return address
is, which a return probe replaces) as they were at the entry. Every call
reaches that instruction, with the same argument and return address; a
probe there sees what one at the entry would. Anything else: offset 0, the
entry itself. Only for x86-64.
"""

from __future__ import annotations

import platform

ENDBR64 = b"\xf3\x0f\x1e\xfa"
SCAN_BYTES = 32
RSP, RDI = 4, 7
KEPT = frozenset({RSP, RDI})  # registers the probes rely on
FLAGS_ONLY = frozenset({0x84, 0x85, 0x38, 0x39, 0x3a, 0x3b})  # test, cmp with a ModRM
WRITES_REG = frozenset({0x8b, 0x33})  # mov, xor r32/64, r/m: writes ModRM.reg
WRITES_RM = frozenset({0x89, 0x31})  # mov, xor r/m, r: writes ModRM.rm


def _modrm_length(code: bytes, i: int) -> int:
    """Bytes of the ModRM byte at i with its SIB and displacement."""
    modrm = code[i]
    mod, rm = modrm >> 6, modrm & 7
    n = 1
    if mod != 3 and rm == 4:  # SIB
        n += 1
        if mod == 0 and code[i + 1] & 7 == 5:
            n += 4
    if mod == 0 and rm == 5:  # rip-relative
        n += 4
    elif mod == 1:
        n += 1
    elif mod == 2:
        n += 4
    return n


def _plain_length(code: bytes, i: int) -> int | None:
    """Length of the instruction at i when it is a plain form that keeps rdi, rsp
    and the stack as they were; None for anything else."""
    rex = code[i] if 0x40 <= code[i] <= 0x4f else 0
    j = i + (1 if rex else 0)
    op = code[j]
    if op == 0x3d:  # cmp eax/rax, imm32
        return j + 5 - i
    if op not in FLAGS_ONLY | WRITES_REG | WRITES_RM and op != 0x83:
        return None
    modrm = code[j + 1]
    mod, reg, rm = modrm >> 6, (modrm >> 3) & 7 | (rex & 4) << 1, modrm & 7 | (rex & 1) << 3
    if op in WRITES_REG and reg in KEPT:
        return None
    if op in WRITES_RM and (rm in KEPT if mod == 3 else modrm & 7 == 4):
        return None  # a register we keep, or a store through a SIB that may be rsp-based
    if op == 0x83 and reg & 7 != 7:
        return None  # only 83 /7 (cmp r/m, imm8): the others write their operand
    return j + 1 + _modrm_length(code, j + 1) - i + (1 if op == 0x83 else 0)


def _is_emulated(code: bytes, i: int) -> bool:
    op = code[i]
    return 0x70 <= op <= 0x7f or op in (0xe9, 0xeb) or (op == 0x0f and 0x80 <= code[i + 1] <= 0x8f)


def probe_offset(code: bytes) -> int:
    """Offset of the function's first emulated instruction reached in straight
    line from its entry (see the module docstring), or 0."""
    if platform.machine() != "x86_64":
        return 0
    i = len(ENDBR64) if code.startswith(ENDBR64) else 0
    try:
        while i < min(len(code), SCAN_BYTES):
            if _is_emulated(code, i):
                return i
            length = _plain_length(code, i)
            if length is None:
                return 0
            i += length
    except IndexError:  # the function's bytes ended inside an instruction
        return 0
    return 0
