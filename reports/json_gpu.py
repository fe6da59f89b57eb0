"""The "gpu" part of `report --format json` (docs/report-json.md, "gpu"), from the model's GpuSummary."""

from __future__ import annotations

from inferprobe.analyzers.gpu import GpuSummary


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
    }
