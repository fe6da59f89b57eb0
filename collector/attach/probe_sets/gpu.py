"""The GPU probe set (bpf/gpu.bpf.c): CUDA launches, waits, copies and allocations.

Finds the CUDA driver (libcuda.so.*) and runtime (libcudart.so.*, also the
copies bundled in wheels such as nvidia-cuda-runtime's or torch's) in every
target's /proc/PID/maps and attaches uprobes to the functions of
collector/model/gpu_catalog.py that the library exports. Libraries loaded later
(torch maps libcuda only when CUDA is first used; engine worker processes
start after the server) are picked up by refresh(), which `record` calls
about once a second.

Per process, not host-wide: a uprobe attached with a pid fires only in that
process, so other processes using the same library file pay nothing.

DRM: dma_fence and gpu_scheduler tracepoints are compiled in when the
running kernel has them.

CUPTI: a target that maps inferprobe's CUPTI shim (loaded by `inferprobe
gpu-attach` or CUDA_INJECTION64_PATH, collector/binaries/cupti_shim.py) has its USDT
probes attached too: what the GPU ran, by correlation id. bcc generates USDT
argument readers when it compiles, so a shim loaded after `record` started is
only noted; the next recording reads it.
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferprobe.collector.attach.libbpf import BpfObject, LibbpfError
from inferprobe.collector.attach.probe_sets import ProbeSet, TargetContext
from inferprobe.collector.attach.uprobe_attach import Probe, attach_functions
from inferprobe.collector.binaries import cupti_shim
from inferprobe.collector.binaries.elf_symbols import functions_matching
from inferprobe.collector.model import gpu_catalog
from inferprobe.collector.model.events import GpuFunction
from inferprobe.collector.model.gpu_catalog import Category, Library
from inferprobe.collector.processes import targets as target_procs
from inferprobe.collector.processes.proc_maps import executable_files

TRACEFS_EVENTS = Path("/sys/kernel/tracing/events")
DEFAULT_RUN_MAX_LAUNCHES = 256
DEFAULT_RUN_MAX_NS = 10_000_000
# (tracefs directory, -D flag) of each DRM tracepoint gpu.bpf.c can use.
# Each DRM tracepoint gpu.bpf.c can use, and its programs there (loaded only where it exists).
DRM_TRACEPOINTS = {
    "dma_fence/dma_fence_wait_start": ("gpu_fence_wait_start", "gpu_fence_wait_end"),
    "gpu_scheduler/drm_sched_job": ("gpu_drm_sched_job",),
    "gpu_scheduler/drm_run_job": ("gpu_drm_run_job",),
    "gpu_scheduler/drm_sched_process_job": ("gpu_drm_sched_process_job",),
}
DRM_COUNT_NAMES = ("drm_sched_job_by_targets", "drm_run_job_host", "drm_sched_process_job_host")
HIST_SLOTS = 32
SHIM_PROBES = ("api", "activity", "clock", "kernel_name", "status")


@dataclass(frozen=True)
class MappedLibrary:
    pid: int
    path: str  # as the process sees it (its mount namespace)
    library: Library
    file_key: tuple[int, int]  # (st_dev, st_ino): one file under many names

    @property
    def host_path(self) -> str:
        """A path to the same file from here, also for a process in a container."""
        return f"/proc/{self.pid}/root{self.path}"


def cuda_libraries(pid: int) -> list[MappedLibrary]:
    """The CUDA libraries pid has mapped (executable mappings only)."""
    found = []
    for mapped in executable_files(pid):
        lib = gpu_catalog.classify_library(os.path.basename(mapped.path))
        if lib is not None:
            found.append(MappedLibrary(pid=pid, path=mapped.path, library=lib, file_key=mapped.file_key))
    return found


@dataclass(frozen=True)
class HookedSymbol:
    function: GpuFunction
    symbol: str
    address: int  # the symbol's value in the file; variants sharing one are hooked once


def exported_functions(path: str, lib: Library) -> list[HookedSymbol]:
    """The catalogue's functions (and their _v2/_ptsz/... variants) that path exports."""
    pattern = gpu_catalog.symbol_pattern(lib)
    found: dict[int, HookedSymbol] = {}
    for symbol, address in functions_matching(path, pattern.pattern):
        match = pattern.match(symbol)
        if not match:
            continue
        fn = gpu_catalog.BY_C_NAME[match.group(1)]
        # Aliases share an address; prefer the plain name in what we report.
        if address not in found or len(symbol) < len(found[address].symbol):
            found[address] = HookedSymbol(function=fn, symbol=symbol, address=address)
    return sorted(found.values(), key=lambda h: (h.function, h.symbol))


def drm_tracepoints() -> dict[str, tuple[str, ...]]:
    """DRM tracepoints of the running kernel that gpu.bpf.c can use: name -> its programs."""
    return {tp: programs for tp, programs in DRM_TRACEPOINTS.items() if (TRACEFS_EVENTS / tp).is_dir()}


@dataclass
class Attachment:
    pid: int
    path: str
    library: str
    t_attached_ns: int  # CLOCK_MONOTONIC: calls before this were not seen
    symbols: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # symbol -> why


class GpuProbes(ProbeSet):
    name = "gpu"
    state_maps = ("gpu_calls", "gpu_runs")
    core_object = "gpu.bpf.o"
    description = "CUDA launches, GPU waits, copies and allocations (uprobes), DRM fence waits"

    def __init__(self) -> None:
        self.mode = "auto"
        self.run_max_launches = DEFAULT_RUN_MAX_LAUNCHES
        self.run_max_ns = DEFAULT_RUN_MAX_NS
        self.drm: dict[str, tuple[str, ...]] = {}
        self.attachments: list[Attachment] = []
        self._done: set[tuple[int, tuple[int, int]]] = set()  # (pid, file) attached or failed
        self._symbols: dict[tuple[int, int], list[HookedSymbol]] = {}
        self._pending: list[MappedLibrary] = []
        self.shim_pids: dict[int, str] = {}  # pid -> the CUPTI shim's path as it maps it
        self._shim_noted: set[int] = set()

    def prepare(self, ctx: TargetContext) -> str | None:
        self.mode = ctx.options.get("gpu", "auto")
        self.run_max_launches = int(ctx.options.get("gpu_run_max_launches", DEFAULT_RUN_MAX_LAUNCHES))
        self.run_max_ns = int(ctx.options.get("gpu_run_max_ns", DEFAULT_RUN_MAX_NS))
        self._pending = [lib for pid in ctx.pids for lib in cuda_libraries(pid)]
        self.drm = drm_tracepoints()
        self.shim_pids = {pid: path for pid in ctx.pids if (path := cupti_shim.mapped_shim(pid))}
        if not self._pending and self.mode != "on":
            return ("no target maps a CUDA library (libcuda.so, libcudart.so); "
                    "record --gpu watches for one loaded later")
        self.description = self._describe()
        return None

    def _describe(self) -> str:
        libs = sorted({f"{m.library.value} ({m.path})" for m in self._pending})
        uprobes = (f"uprobes on {', '.join(libs)}" if libs
                   else "no CUDA library mapped yet: re-scanning every second")
        drm = ", ".join(sorted(self.drm)) or "none in this kernel"
        launches = ("every launch streamed" if self.run_max_launches == 1 else
                    f"launches summed in the kernel per run of up to {self.run_max_launches}")
        shim = (f"CUPTI shim in pid {', '.join(map(str, sorted(self.shim_pids)))}" if self.shim_pids
                else "no CUPTI shim (GPU execution times: inferprobe gpu-attach)")
        return f"CUDA calls via {uprobes}; {launches}; DRM tracepoints: {drm}; {shim}"

    def configure(self, core: BpfObject) -> None:
        core.set_constant("gpu_run_max_launches", self.run_max_launches)
        core.set_constant("gpu_run_max_ns", self.run_max_ns)
        for tracepoint, programs in DRM_TRACEPOINTS.items():
            for program in programs:
                core.set_autoload(program, tracepoint in self.drm)

    def after_load(self, bpf, ctx: TargetContext) -> None:
        assert self.core is not None, "the loader loads core_object before after_load"
        for programs in self.drm.values():
            for program in programs:
                self.core.attach(program)
        for pid, path in sorted(self.shim_pids.items()):
            self._attach_shim(pid, path, ctx)
        for mapped in self._pending:
            self._attach(mapped)
        self._pending = []

    def _attach_shim(self, pid: int, path: str, ctx: TargetContext) -> None:
        """The CUPTI shim's USDT probes in pid; one that cannot be attached costs that process
        its GPU times only."""
        assert self.core is not None, "the loader loads core_object before after_load"
        failed = {}
        for name in SHIM_PROBES:
            try:
                self.core.attach_usdt(f"gpu_shim_{name}", pid, f"/proc/{pid}/root{path}",
                                      cupti_shim.PROVIDER, name, cookie=0)
            except LibbpfError as err:
                failed[name] = str(err)
        ctx.attach_failures.add_functions(pid, self.name, f"the CUPTI shim's USDT probes in {path}", failed)

    def refresh(self, bpf, ctx: TargetContext) -> list[str]:
        """Attaches to CUDA libraries that targets (and new children) mapped since."""
        notes = []
        for pid in target_procs.with_descendants(ctx.pids):
            for mapped in cuda_libraries(pid):
                if (pid, mapped.file_key) in self._done:
                    continue
                att = self._attach(mapped)
                notes.append(f"gpu: attached to {len(att.symbols)} functions of {mapped.path} "
                             f"in pid {pid}")
            if pid not in self.shim_pids and pid not in self._shim_noted and cupti_shim.mapped_shim(pid):
                self._shim_noted.add(pid)
                notes.append(f"gpu: pid {pid} loaded the CUPTI shim after recording began; its GPU "
                             "times are read by the next recording (run gpu-attach before record)")
        return notes

    def _attach(self, mapped: MappedLibrary) -> Attachment:
        self._done.add((mapped.pid, mapped.file_key))
        att = Attachment(pid=mapped.pid, path=mapped.path, library=mapped.library.value,
                         t_attached_ns=0)
        self.attachments.append(att)
        symbols = self._symbols.get(mapped.file_key)
        if symbols is None:
            try:
                symbols = exported_functions(mapped.host_path, mapped.library)
            except Exception as err:  # ELF readers raise bare Exception for unreadable files
                att.failed["*"] = str(err)
                return att
            self._symbols[mapped.file_key] = symbols
        hooked_names, failed = attach_functions(self.core, mapped.host_path, mapped.pid, [
            (hooked.symbol, [Probe(hooked.address, f"gpu_enter_GPU_FN_{hooked.function.name}"),
                             *([] if self._entry_only(hooked.function) else
                               [Probe(hooked.address, f"gpu_return_GPU_FN_{hooked.function.name}",
                                      on_return=True)])])
            for hooked in symbols])
        att.symbols.extend(hooked_names)
        att.failed.update(failed)
        att.t_attached_ns = time.monotonic_ns()
        return att

    @staticmethod
    def _entry_only(fn: GpuFunction) -> bool:
        # Driver launches are the innermost layer: no return probe (gpu.bpf.c).
        return gpu_catalog.category(fn) == Category.LAUNCH and gpu_catalog.library(fn) == Library.DRIVER

    def snapshot(self, bpf) -> dict:
        assert self.core is not None, "the loader loads core_object before snapshot"
        bpf = self.core
        return {
            "mode": self.mode,
            "run_max_launches": self.run_max_launches,
            "run_max_ns": self.run_max_ns,
            "drm_tracepoints": sorted(self.drm),
            "cupti_shim": {str(pid): path for pid, path in sorted(self.shim_pids.items())},
            "attachments": [vars(a) for a in self.attachments],
            "functions": self._function_stats(bpf),
            "open_runs": self._open_runs(bpf),
            "drm_counts": self._drm_counts(bpf),
        }

    @staticmethod
    def _function_stats(bpf) -> dict[str, dict]:
        table = bpf[b"gpu_fn_stats"]
        out = {}
        for fn in GpuFunction:
            per_cpu = table[ctypes.c_int(int(fn))]
            total = {"calls": 0, "nested": 0, "errors": 0, "total_ns": 0, "bytes": 0}
            hist = [0] * HIST_SLOTS
            for cpu in per_cpu:
                for key in total:
                    total[key] += getattr(cpu, key)
                for i in range(HIST_SLOTS):
                    hist[i] += cpu.hist[i]
            if total["calls"] or total["nested"]:
                out[fn.name] = {**total, "hist_log2_ns": hist}
        return out

    @staticmethod
    def _open_runs(bpf) -> list[dict]:
        """Launch runs not yet sent (no step boundary since): kept so no launch is lost."""
        runs = []
        for key, run in bpf[b"gpu_runs"].items():
            runs.append({"pid": run.pid, "tid": key.value, "first_ns": run.first_ns, "last_ns": run.last_ns,
                         "launch_ns": run.launch_ns, "kernels": run.kernels, "graphs": run.graphs})
        return runs

    @staticmethod
    def _drm_counts(bpf) -> dict[str, int]:
        table = bpf[b"gpu_drm_counts"]
        return {name: int(sum(table[ctypes.c_int(i)])) for i, name in enumerate(DRM_COUNT_NAMES)}
