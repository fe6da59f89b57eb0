#!/usr/bin/env python3
"""Calls the real CUDA runtime (libcudart from the nvidia-cuda-runtime wheel) through ctypes.

Without a GPU every call fails fast (cudaErrorInsufficientDriver or
cudaErrorNoDevice), but it is a real call into the real library, so uprobes
on it fire. The program times each call itself with CLOCK_MONOTONIC (the
clock bpf_ktime_get_ns reads) and prints what it did, for a test to compare
with what the tracer saw.

Protocol on stdin/stdout, one line each:
  -> READY <pid>            started (with --load-later: libcudart not loaded yet)
  <- load                   (--load-later only) dlopen libcudart now
  -> LOADED <path>
  <- go                     run the plan
  -> CALLS <json>           [{"fn", "before_ns", "after_ns", "ret", ...}, ...] in call order
  <- exit

Plan (see --steps, --launches): 3 x cudaGetDeviceCount; per step N x
cudaLaunchKernel then one device-to-host cudaMemcpy of step-dependent size,
then cudaStreamSynchronize; then one cudaMemcpy of each other direction;
2 x cudaMalloc, 2 x cudaFree; then --tail-launches launches with no call
after them (a run still open when recording stops).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE = 1, 2, 3
FAKE_DEVICE_PTR = 0x7F00_0000_1000  # never dereferenced: the calls fail before any copy


def cudart_path() -> Path:
    import nvidia.cuda_runtime

    return Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12"


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def load(path: Path):
    lib = ctypes.CDLL(str(path))
    lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.c_size_t, ctypes.c_void_p]
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib


def run_plan(lib, steps: int, launches: int, tail_launches: int) -> list[dict]:
    calls: list[dict] = []
    host = ctypes.create_string_buffer(1 << 20)
    grid, block = Dim3(1, 1, 1), Dim3(32, 1, 1)
    count = ctypes.c_int(0)
    kernel = ctypes.c_void_p(0x1234)  # a fake kernel handle: the call fails on the driver check

    def timed(fn: str, call, **args) -> None:
        before = time.monotonic_ns()
        ret = call()
        after = time.monotonic_ns()
        calls.append({"fn": fn, "before_ns": before, "after_ns": after, "ret": ret, **args})

    for _ in range(3):
        timed("cudaGetDeviceCount", lambda: lib.cudaGetDeviceCount(ctypes.byref(count)))
    for step in range(steps):
        for _ in range(launches):
            timed("cudaLaunchKernel", lambda: lib.cudaLaunchKernel(kernel, grid, block, None, 0, None),
                  step=step)
        size = 4 * (step + 1)  # the sampled token ids of a batch of step + 1
        timed("cudaMemcpy", lambda size=size: lib.cudaMemcpy(host, FAKE_DEVICE_PTR, size, DEVICE_TO_HOST),
              bytes=size, kind=DEVICE_TO_HOST, step=step)
        timed("cudaStreamSynchronize", lambda: lib.cudaStreamSynchronize(None), step=step)
    for size, kind in ((1 << 20, HOST_TO_DEVICE), (12345, DEVICE_TO_DEVICE)):
        timed("cudaMemcpy", lambda size=size, kind=kind: lib.cudaMemcpy(FAKE_DEVICE_PTR, host, size, kind),
              bytes=size, kind=kind)
    for size in (1 << 16, 3 << 20):
        ptr = ctypes.c_void_p(0)
        timed("cudaMalloc", lambda ptr=ptr, size=size: lib.cudaMalloc(ctypes.byref(ptr), size), bytes=size)
    for addr in (FAKE_DEVICE_PTR, FAKE_DEVICE_PTR + 4096):
        timed("cudaFree", lambda addr=addr: lib.cudaFree(addr), addr=addr)
    for _ in range(tail_launches):
        timed("cudaLaunchKernel", lambda: lib.cudaLaunchKernel(kernel, grid, block, None, 0, None),
              step=steps)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--launches", type=int, default=7, help="launches per step")
    parser.add_argument("--tail-launches", type=int, default=3)
    parser.add_argument("--load-later", action="store_true")
    args = parser.parse_args()
    lib = None if args.load_later else load(cudart_path())
    print(f"READY {os.getpid()}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "load":
            lib = load(cudart_path())
            print(f"LOADED {cudart_path()}", flush=True)
        elif command == "go":
            calls = run_plan(lib, args.steps, args.launches, args.tail_launches)
            print("CALLS " + json.dumps(calls), flush=True)
        elif command == "exit":
            return


if __name__ == "__main__":
    main()
