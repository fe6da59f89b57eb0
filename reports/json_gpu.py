"""The "gpu" part of `report --format json` (docs/report-json.md, "gpu"), from the model's GpuSummary."""

from __future__ import annotations

from inferprobe.analyzers.gpu import GpuSummary
from inferprobe.analyzers.gpu_execution import GpuExecutionSummary, WindowGpu


def _window(w: WindowGpu | None) -> dict | None:
    if w is None:
        return None
    return {"executions": w.executions, "kernels": w.kernels, "busy_ns": w.busy_ns, "span_ns": w.span_ns,
            "idle_ns": w.idle_ns, "largest_gap_ns": w.largest_gap_ns, "kernel_ns": w.kernel_ns}


def execution_json(x: GpuExecutionSummary) -> dict:
    """The CUPTI shim's part (docs/gpu.md): what the GPU ran, per request, step and kernel name."""
    return {
        "shim": {str(pid): text for pid, text in x.shim.items()},
        "collecting": x.collecting,
        "records": x.records, "joined": x.joined, "without_launch": x.without_launch,
        "without_clock": x.without_clock,
        "clock": {str(pid): {"pairs": n, "max_residual_ns": x.clock_max_residual_ns[pid]}
                  for pid, n in x.clock_pairs.items()},
        "busy_ns": x.busy_ns,
        "kernels": [{"name": k.name, "kind": k.kind, "count": k.count, "total_ns": k.total_ns,
                     "max_ns": k.max_ns} for k in x.kernels],
        "requests": [{
            "request": r.index, "attributed_by": r.attributed_by, "concurrent": r.concurrent,
            **(_window(r.gpu) or {}),
            "t_first_launch_ns": r.t_first_launch_ns, "first_gpu_start_ns": r.first_gpu_start_ns,
            "launch_queue_ns": r.launch_queue_ns, "gpu_before_first_token_ns": r.gpu_before_first_token_ns,
            "last_gpu_end_to_first_token_ns": r.last_gpu_end_to_first_token_ns,
        } for r in x.requests],
        "steps": [{"pid": s.pid, "tid": s.tid, "t_start_ns": s.t_start_ns, "t_end_ns": s.t_end_ns,
                   "gpu_busy_share": s.gpu_busy_share, "gpu": _window(s.gpu)} for s in x.steps],
    }


def gpu_json(g: GpuSummary) -> dict:
    return {
        "sources": g.sources,
        "functions": {name: {
            "library": f.library, "category": f.category, "calls": f.calls, "nested": f.nested,
            "errors": f.errors, "total_ns": f.total_ns, "p99_ns": f.p99_ns, "p99_from": f.p99_from,
            "bytes": f.bytes if f.category in ("copy", "memory") else None,
        } for name, f in g.functions.items()},
        "processes": [{
            "pid": p.pid, "launches": p.launches, "graph_launches": p.graph_launches,
            "launches_per_s": p.launches_per_s, "wait_ns": p.wait_ns, "wait_share": p.wait_share,
            "wait_tid": p.wait_tid, "copies": p.copies, "allocations": p.allocations,
        } for p in g.processes],
        "steps": {
            "from": g.steps_from,
            "count": len(g.steps),
            "wait_share": g.step_wait_share,
            "wait_ns": g.step_waits.as_dict(),
            "launches": g.step_launches.as_dict(),
            "graph_launches": sum(s.graph_launches for s in g.steps),
        },
        "fence_waits_ns": g.fence_waits.as_dict(),
        "requests": [{
            "request": r.index, "attributed_by": r.attributed_by, "gpu_wait_ns": r.gpu_wait_ns,
            "gpu_launches": r.gpu_launches, "gpu_graph_launches": r.gpu_graph_launches,
            "t_first_launch_ns": r.t_first_launch_ns, "launch_to_first_token_ns": r.launch_to_first_token_ns,
        } for r in g.requests],
        "findings": [{"kind": f.kind, "message": f.sentence, "value": f.value} for f in g.findings],
        "execution": execution_json(g.execution) if g.execution is not None else None,
    }
