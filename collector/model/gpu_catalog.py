"""The CUDA functions inferprobe hooks: names, libraries and what kind of call each is.

Shared by the probe set (which symbols to attach to) and the GPU analyzer
(what to call a function in a report). No bcc, no /proc here.

A function's category follows from its number (bpf/inferprobe.h, enum
gpu_function): the BPF side branches on the same ranges.
"""

from __future__ import annotations

import re
from enum import StrEnum

from inferprobe.collector.model.events import (
    GPU_FN_FIRST_COPY,
    GPU_FN_FIRST_MEMORY,
    GPU_FN_FIRST_QUERY,
    GPU_FN_FIRST_WAIT,
    GpuCopyKind,
    GpuFunction,
)


class Category(StrEnum):
    LAUNCH = "launch"
    WAIT = "wait"
    COPY = "copy"
    MEMORY = "memory"
    QUERY = "query"


class Library(StrEnum):
    DRIVER = "libcuda"
    RUNTIME = "libcudart"


def category(fn: GpuFunction) -> Category:
    if fn < GPU_FN_FIRST_WAIT:
        return Category.LAUNCH
    if fn < GPU_FN_FIRST_COPY:
        return Category.WAIT
    if fn < GPU_FN_FIRST_MEMORY:
        return Category.COPY
    if fn < GPU_FN_FIRST_QUERY:
        return Category.MEMORY
    return Category.QUERY


GRAPH_LAUNCHES = frozenset({GpuFunction.CU_GRAPH_LAUNCH, GpuFunction.CUDA_GRAPH_LAUNCH})
FREES = frozenset({GpuFunction.CU_MEM_FREE, GpuFunction.CU_MEM_FREE_ASYNC, GpuFunction.CUDA_FREE,
                   GpuFunction.CUDA_FREE_ASYNC})

# The C name of each function. Exported variants of the same call (the
# versioned _v2/_v3 driver entry points that cuda.h maps the plain name to,
# and the per-thread-default-stream _ptsz/_ptds ones) are hooked under the
# same id: see symbol_pattern().
C_NAME: dict[GpuFunction, str] = {
    GpuFunction.CU_LAUNCH_KERNEL: "cuLaunchKernel",
    GpuFunction.CU_LAUNCH_KERNEL_EX: "cuLaunchKernelEx",
    GpuFunction.CU_GRAPH_LAUNCH: "cuGraphLaunch",
    GpuFunction.CUDA_LAUNCH_KERNEL: "cudaLaunchKernel",
    GpuFunction.CUDA_LAUNCH_KERNEL_EX: "cudaLaunchKernelExC",
    GpuFunction.CUDA_GRAPH_LAUNCH: "cudaGraphLaunch",
    GpuFunction.CU_STREAM_SYNCHRONIZE: "cuStreamSynchronize",
    GpuFunction.CU_EVENT_SYNCHRONIZE: "cuEventSynchronize",
    GpuFunction.CU_CTX_SYNCHRONIZE: "cuCtxSynchronize",
    GpuFunction.CU_STREAM_WAIT_EVENT: "cuStreamWaitEvent",
    GpuFunction.CUDA_STREAM_SYNCHRONIZE: "cudaStreamSynchronize",
    GpuFunction.CUDA_EVENT_SYNCHRONIZE: "cudaEventSynchronize",
    GpuFunction.CUDA_DEVICE_SYNCHRONIZE: "cudaDeviceSynchronize",
    GpuFunction.CUDA_STREAM_WAIT_EVENT: "cudaStreamWaitEvent",
    GpuFunction.CU_MEMCPY: "cuMemcpy",
    GpuFunction.CU_MEMCPY_ASYNC: "cuMemcpyAsync",
    GpuFunction.CU_MEMCPY_DTOH: "cuMemcpyDtoH",
    GpuFunction.CU_MEMCPY_DTOH_ASYNC: "cuMemcpyDtoHAsync",
    GpuFunction.CU_MEMCPY_HTOD: "cuMemcpyHtoD",
    GpuFunction.CU_MEMCPY_HTOD_ASYNC: "cuMemcpyHtoDAsync",
    GpuFunction.CU_MEMCPY_DTOD: "cuMemcpyDtoD",
    GpuFunction.CU_MEMCPY_DTOD_ASYNC: "cuMemcpyDtoDAsync",
    GpuFunction.CUDA_MEMCPY: "cudaMemcpy",
    GpuFunction.CUDA_MEMCPY_ASYNC: "cudaMemcpyAsync",
    GpuFunction.CU_MEM_ALLOC: "cuMemAlloc",
    GpuFunction.CU_MEM_FREE: "cuMemFree",
    GpuFunction.CU_MEM_ALLOC_ASYNC: "cuMemAllocAsync",
    GpuFunction.CU_MEM_FREE_ASYNC: "cuMemFreeAsync",
    GpuFunction.CUDA_MALLOC: "cudaMalloc",
    GpuFunction.CUDA_FREE: "cudaFree",
    GpuFunction.CUDA_MALLOC_ASYNC: "cudaMallocAsync",
    GpuFunction.CUDA_FREE_ASYNC: "cudaFreeAsync",
    GpuFunction.CUDA_GET_DEVICE_COUNT: "cudaGetDeviceCount",
}
assert set(C_NAME) == set(GpuFunction)

# Runtime copies say their direction in an argument; driver copies in their name.
FIXED_COPY_KIND: dict[GpuFunction, GpuCopyKind] = {
    GpuFunction.CU_MEMCPY: GpuCopyKind.DEFAULT,
    GpuFunction.CU_MEMCPY_ASYNC: GpuCopyKind.DEFAULT,
    GpuFunction.CU_MEMCPY_DTOH: GpuCopyKind.DTOH,
    GpuFunction.CU_MEMCPY_DTOH_ASYNC: GpuCopyKind.DTOH,
    GpuFunction.CU_MEMCPY_HTOD: GpuCopyKind.HTOD,
    GpuFunction.CU_MEMCPY_HTOD_ASYNC: GpuCopyKind.HTOD,
    GpuFunction.CU_MEMCPY_DTOD: GpuCopyKind.DTOD,
    GpuFunction.CU_MEMCPY_DTOD_ASYNC: GpuCopyKind.DTOD,
}

COPY_DIRECTION_NAME = {
    GpuCopyKind.HTOH: "host_to_host",
    GpuCopyKind.HTOD: "host_to_device",
    GpuCopyKind.DTOH: "device_to_host",
    GpuCopyKind.DTOD: "device_to_device",
    GpuCopyKind.DEFAULT: "inferred",
}


def library(fn: GpuFunction) -> Library:
    return Library.RUNTIME if C_NAME[fn].startswith("cuda") else Library.DRIVER


def name(fn: GpuFunction) -> str:
    return C_NAME[fn]


# A library file name as it appears in /proc/PID/maps: the system's
# libcuda.so.1, libcudart.so.12, or a copy bundled in a wheel, which some
# wheels rename with a hash (libcudart-d0da41ae.so.11.0).
LIBRARY_FILE = {
    Library.DRIVER: re.compile(r"^libcuda(-[0-9a-f]{8})?\.so(\.\d+)*$"),
    Library.RUNTIME: re.compile(r"^libcudart(-[0-9a-f]{8})?\.so(\.\d+)*$"),
}

_VARIANT_SUFFIX = r"(_v\d)?(_ptsz|_ptds)?"


def symbol_pattern(lib: Library) -> re.Pattern[str]:
    """Matches every exported name of every hooked function of lib; group 1 is the C name."""
    names = sorted((C_NAME[fn] for fn in GpuFunction if library(fn) == lib), key=len, reverse=True)
    return re.compile(rf"^({'|'.join(map(re.escape, names))}){_VARIANT_SUFFIX}$")


BY_C_NAME = {c: fn for fn, c in C_NAME.items()}


def classify_library(file_name: str) -> Library | None:
    for lib, pattern in LIBRARY_FILE.items():
        if pattern.match(file_name):
            return lib
    return None
