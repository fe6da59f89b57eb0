"""The llama.cpp probe set (bpf/llama.bpf.c): engine steps of an unmodified llama.cpp.

Finds llama.cpp's C API in every target: the file that exports
`llama_decode` or `llama_process`, among the executable files the process
maps (libllama.so for a default build; llama-server itself, or Ollama's
runner, when libllama is linked in). Which API, and so which probes, is
decided per file by collector/binaries/llama_api.py. Attaches the probes there, per
process. Nothing in the server changes and it need not restart.

What the steps become (per-request queue, prefill and decode, batch sizes,
stalls) is worked out in collector/ingest/llama_view.py; how a step's batch is read
is in bpf/llama.bpf.c; docs/engines.md has both.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.uprobe_attach import Probe, attach_functions
from inferprobe.collector.binaries.llama_api import DECODE, SYNCHRONIZE, LlamaApi, find_api
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.proc_maps import MappedFile, executable_files

BPF_LOOP_KERNEL = (5, 17)   # bpf/llama.bpf.c scans a batch's runs with bpf_loop


def _candidate(mapped: MappedFile, exe: str | None) -> bool:
    """Files worth a symbol-table scan: the process's executable (libllama linked
    in: llama-server built static, Ollama's runner) and files named for llama
    (libllama.so, llama-cpp-python's copy). Scanning every library would read
    hundreds of megabytes of symbols in a torch process at every start."""
    return mapped.path == exe or "llama" in os.path.basename(mapped.path).lower()


def llama_targets(pid: int, skip: set[tuple[int, int]] | None = None) -> list[tuple[MappedFile, LlamaApi]]:
    """(file, its llama.cpp API) for each file of pid that exports one, refused ones
    included (api.refusal); files in skip (already scanned) are not read again and
    are added to it."""
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
        api = find_api(mapped.host_path)
        if api is not None:
            out.append((mapped, api))
    return out


def probes_for(api: LlamaApi) -> list[tuple[str, list[Probe]]]:
    """(function, its probes) to attach for a file's API (bpf/llama.bpf.c's programs)."""
    at = api.addresses
    if api.kind == DECODE:
        functions = [(DECODE, [Probe(at[DECODE], "llama_enter_decode"),
                               Probe(at[DECODE], "llama_return_decode", on_return=True)])]
    else:
        functions = [(name, [Probe(at[name], "llama_enter_step"),
                             Probe(at[name], "llama_return_step", on_return=True)])
                     for name in api.step_functions]
        # (init's probes send nothing outside a step: training's opt_epoch calls it too)
        functions += [(name, [Probe(at[name], "llama_enter_allocr_init"),
                              Probe(at[name], "llama_return_allocr_init", on_return=True)])
                      for name in api.init_functions]
    if SYNCHRONIZE in at:
        functions.append((SYNCHRONIZE, [Probe(at[SYNCHRONIZE], "llama_enter_sync"),
                                        Probe(at[SYNCHRONIZE], "llama_return_sync", on_return=True)]))
    return functions


@dataclass
class Attachment:
    pid: int
    path: str
    api: str  # "llama_decode" or "llama_process" (collector/binaries/llama_api.py)
    t_attached_ns: int
    hooked: list[str] = field(default_factory=list)
    error: str | None = None  # nothing hooked: why (a refusal, a failed attach)


class LlamaProbes(ProbeSet):
    name = "llama"
    core_object = "llama.bpf.o"
    description = "llama.cpp engine steps (uprobes on llama_decode or llama_process)"

    def __init__(self) -> None:
        self.attachments: list[Attachment] = []
        self._pending: list[tuple[MappedFile, LlamaApi]] = []
        self._scanned: dict[int, set[tuple[int, int]]] = {}  # pid -> files whose symbols were read

    def prepare(self, ctx: TargetContext) -> str | None:
        from inferprobe.collector.attach.kernel_version import kernel_at_least

        if not kernel_at_least(BPF_LOOP_KERNEL):
            return (f"reading a batch needs bpf_loop, Linux {BPF_LOOP_KERNEL[0]}.{BPF_LOOP_KERNEL[1]}+ "
                    f"(this kernel is {os.uname().release}): llama.cpp's steps are not recorded")
        found = [hit for pid in ctx.pids for hit in llama_targets(pid, self._scanned.setdefault(pid, set()))]
        self._pending = [(m, api) for m, api in found if api.refusal is None]
        if not self._pending:
            refusals = sorted({api.refusal for _m, api in found if api.refusal})
            return "; ".join(refusals) or "no target exports llama_decode or llama_process (no llama.cpp)"
        files = sorted({f"{api.kind} in {m.path} (pid {m.pid})" for m, api in self._pending})
        self.description = f"llama.cpp engine steps: uprobes on {', '.join(files)}"
        return None

    def after_load(self, bpf, ctx: TargetContext) -> None:
        for mapped, api in self._pending:
            self._attach(mapped, api)
        self._pending = []

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        """New children of a target (a runner started per model, as Ollama does) and
        libllama loaded later (llama-cpp-python at import): only files not read before."""
        notes = []
        for pid in target_procs.with_descendants(ctx.pids):
            for mapped, api in llama_targets(pid, self._scanned.setdefault(pid, set())):
                att = self._attach(mapped, api)
                notes.append(f"llama: {att.error}" if att.error
                             else f"llama: attached to {api.kind} in {mapped.path} (pid {pid})")
        return notes

    def _attach(self, mapped: MappedFile, api: LlamaApi) -> Attachment:
        assert self.core is not None, "the loader loads core_object before after_load"
        att = Attachment(mapped.pid, mapped.path, api.kind, 0, error=api.refusal)
        self.attachments.append(att)
        if api.refusal is None:
            if api.batch_offset is not None:  # where this process's llama_batch_allocr keeps its batch
                self.core["llama_batch_offset"][mapped.pid] = api.batch_offset
            att.hooked, failed = attach_functions(self.core, mapped.host_path, mapped.pid, probes_for(api))
            if failed:
                att.error = "; ".join(f"{name}: {why}" for name, why in failed.items())
        att.t_attached_ns = time.monotonic_ns()
        return att

    def snapshot(self, bpf) -> dict:
        return {"attachments": [vars(a) for a in self.attachments]}
