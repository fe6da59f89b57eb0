"""The llama.cpp probe set (bpf/llama.bpf.c): engine steps of an unmodified llama.cpp.

Finds llama.cpp's C API in every target: the file that exports
`llama_decode`, among the executable files the process maps (libllama.so
for a default build; llama-server itself, or Ollama's runner, when libllama
is linked in statically). Attaches an entry and a return uprobe there, per
process. Nothing in the server changes and it need not restart.

What the steps become (per-request queue, prefill and decode, batch sizes,
stalls) is worked out in collector/llama_view.py; how a step's batch is read
is in bpf/llama.bpf.c; docs/engines.md has both.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from inferprobe.collector import targets as target_procs
from inferprobe.collector.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.proc_maps import MappedFile, executable_files

DECODE_SYMBOL = "llama_decode"


def decode_address(path: str) -> int | None:
    """llama_decode's address in the ELF file at path, or None when it has none."""
    from bcc import BPF

    try:
        for name, address in BPF.get_user_functions_and_addresses(path, f"^{DECODE_SYMBOL}$"):
            if name.decode() == DECODE_SYMBOL and address:
                return int(address)
    except Exception:  # bcc raises bare Exception for a file that is no ELF it can read
        return None
    return None


def _candidate(mapped: MappedFile, exe: str | None) -> bool:
    """Files worth a symbol-table scan: the process's executable (libllama linked
    in: llama-server built static, Ollama's runner) and files named for llama
    (libllama.so, llama-cpp-python's copy). Scanning every library would read
    hundreds of megabytes of symbols in a torch process at every start."""
    return mapped.path == exe or "llama" in os.path.basename(mapped.path).lower()


def llama_targets(pid: int, skip: set[tuple[int, int]] | None = None) -> list[tuple[MappedFile, int]]:
    """(file, llama_decode's address) for each file of pid that exports it;
    files in skip (already scanned) are not read again and are added to it."""
    out = []
    try:
        exe: str | None = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = None
    for mapped in executable_files(pid):
        if not _candidate(mapped, exe):
            continue
        if skip is not None:
            if mapped.file_key in skip:
                continue
            skip.add(mapped.file_key)
        address = decode_address(mapped.host_path)
        if address is not None:
            out.append((mapped, address))
    return out


@dataclass
class Attachment:
    pid: int
    path: str
    address: int
    t_attached_ns: int
    error: str | None = None


class LlamaProbes(ProbeSet):
    name = "llama"
    source = "llama.bpf.c"
    description = "llama.cpp engine steps (uprobes on llama_decode)"

    def __init__(self) -> None:
        self.attachments: list[Attachment] = []
        self._pending: list[tuple[MappedFile, int]] = []
        self._done: set[tuple[int, tuple[int, int]]] = set()
        self._scanned: dict[int, set[tuple[int, int]]] = {}  # pid -> files whose symbols were read

    def prepare(self, ctx: TargetContext) -> str | None:
        self._pending = [hit for pid in ctx.pids
                         for hit in llama_targets(pid, self._scanned.setdefault(pid, set()))]
        if not self._pending:
            return "no target exports llama_decode (no llama.cpp engine in it)"
        files = sorted({f"{m.path} (pid {m.pid})" for m, _ in self._pending})
        self.description = f"llama.cpp engine steps: uprobes on llama_decode in {', '.join(files)}"
        return None

    def after_load(self, bpf, ctx: TargetContext) -> None:
        import ctypes

        from bcc import BPF

        # bpf/llama.bpf.c reads a batch's runs one per program, by tail calls to this one.
        scanner = bpf.load_func(b"llama_scan_run", BPF.KPROBE)
        bpf.get_table("llama_scan_prog")[ctypes.c_int(0)] = ctypes.c_int(scanner.fd)
        for mapped, address in self._pending:
            self._attach(bpf, mapped, address)
        self._pending = []

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        """New children of a target (a runner started per model, as Ollama does) and
        libllama loaded later (llama-cpp-python at import): only files not read before."""
        notes = []
        for pid in target_procs.with_descendants(ctx.pids):
            for mapped, address in llama_targets(pid, self._scanned.setdefault(pid, set())):
                att = self._attach(bpf, mapped, address)
                if att.error is None:
                    notes.append(f"llama: attached to llama_decode in {mapped.path} (pid {pid})")
        return notes

    def _attach(self, bpf, mapped: MappedFile, address: int) -> Attachment:
        self._done.add((mapped.pid, mapped.file_key))
        att = Attachment(mapped.pid, mapped.path, address, 0)
        self.attachments.append(att)
        path = mapped.host_path.encode()
        try:
            bpf.attach_uprobe(name=path, addr=address, fn_name=b"llama_enter_decode", pid=mapped.pid)
            bpf.attach_uretprobe(name=path, addr=address, fn_name=b"llama_return_decode", pid=mapped.pid)
        except Exception as err:  # bcc: bare Exception (a dead pid, the probe limit)
            att.error = str(err)
        att.t_attached_ns = time.monotonic_ns()
        return att

    def snapshot(self, bpf) -> dict:
        return {"attachments": [vars(a) for a in self.attachments]}
