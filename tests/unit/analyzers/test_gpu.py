"""analyzers/gpu.py on built timelines: attribution, step shares, findings."""

from __future__ import annotations

from inferprobe.analyzers.gpu import _hist_p99, summarize_gpu
from inferprobe.collector.model.events import GpuCopyKind, GpuFunction, decode
from inferprobe.collector.model.timeline import DecodeStep, Outcome, Request, ServerRequest

from tests.factories import gpu_call, gpu_launches

MS = 1_000_000
SYNC = GpuFunction.CUDA_STREAM_SYNCHRONIZE
DTOH = GpuFunction.CUDA_MEMCPY


def decode_step_loop(steps: int, launches: int, launch_ms: float, wait_ms: float, t0: int = 0,
                     pid: int = 100, tid: int = 101, graphs: bool = False):
    """An engine thread: per step, launches for launch_ms, then a DtoH copy that waits wait_ms."""
    events, step_list = [], []
    t = t0
    for i in range(steps):
        start = t
        end_launch = t + int(launch_ms * MS)
        events.append(gpu_launches(t, end_launch, 0 if graphs else launches, graphs=1 if graphs else 0,
                                   pid=pid, tid=tid))
        copy_end = end_launch + int(wait_ms * MS)
        events.append(gpu_call(DTOH, end_launch, copy_end, pid=pid, tid=tid, nbytes=4,
                               copy_kind=GpuCopyKind.DTOH))
        step_list.append(DecodeStep(pid=pid, tid=tid, step_id=i, t_start_ns=start, t_end_ns=copy_end,
                                    batch_size=1, tokens_in_batch=1))
        t = copy_end
    return [decode(e) for e in events], step_list


def summarize(events, steps=(), requests=(), wall_ns=None):
    return summarize_gpu(list(events), None, list(requests), list(steps), wall_ns, "test")


def test_sync_bound_steps_are_said_to_wait_on_the_gpu():
    events, steps = decode_step_loop(steps=10, launches=50, launch_ms=1, wait_ms=3)
    g = summarize(events, steps)
    assert g.steps_from == "decode_steps"
    assert abs(g.step_wait_share - 0.75) < 1e-9
    (finding,) = g.findings
    assert finding.kind == "sync_bound" and "75 %" in finding.sentence.replace("%", " %")
    assert "cudaMemcpy" in finding.sentence


def test_launch_bound_steps_suggest_cuda_graphs():
    events, steps = decode_step_loop(steps=10, launches=300, launch_ms=9, wait_ms=1)
    g = summarize(events, steps)
    (finding,) = g.findings
    assert finding.kind == "launch_bound" and "CUDA graphs" in finding.sentence
    assert abs(finding.value - 0.1) < 1e-9


def test_graph_launching_steps_are_not_called_launch_bound():
    events, steps = decode_step_loop(steps=10, launches=300, launch_ms=9, wait_ms=1, graphs=True)
    assert summarize(events, steps).findings == []


def test_without_usdt_steps_gpu_cycles_stand_in():
    events, _ = decode_step_loop(steps=6, launches=20, launch_ms=1, wait_ms=4)
    g = summarize(events)
    assert g.steps_from == "gpu_cycles" and len(g.steps) == 6
    assert abs(g.step_wait_share - 0.8) < 1e-9
    assert [f.kind for f in g.findings] == ["sync_bound"]


def test_request_gets_the_waits_and_launches_of_its_own_steps():
    events, steps = decode_step_loop(steps=6, launches=10, launch_ms=1, wait_ms=2, t0=10 * MS)
    # the request took part in steps 2..4 only; another request owns the rest
    server = ServerRequest(pid=100, req_id=7, tid=100, t_scheduled_ns=15 * MS, steps=steps[2:5])
    r = Request(pid=100, tid=100, conn=1, method="POST", path="/v1", t_ingress_ns=9 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=40 * MS, token_ns=[29 * MS], server=server)
    g = summarize(events, steps, [r])
    (rg,) = g.requests
    assert rg.attributed_by == "decode_steps"
    assert (rg.gpu_wait_ns, rg.gpu_launches) == (3 * 2 * MS, 3 * 10)
    # steps take 3 ms from 10 ms: the first launch after dispatch (15 ms) opens step 2, at 16 ms
    assert rg.t_first_launch_ns == steps[2].t_start_ns == 16 * MS
    assert rg.launch_to_first_token_ns == 13 * MS


def test_thread_attribution_needs_a_sole_request_in_flight():
    events = [decode(gpu_launches(2 * MS, 3 * MS, 5, tid=100)),
              decode(gpu_call(SYNC, 3 * MS, 4 * MS, tid=100)),
              decode(gpu_launches(12 * MS, 13 * MS, 5, tid=100)),   # both requests in flight
              decode(gpu_call(SYNC, 13 * MS, 14 * MS, tid=100))]
    a = Request(pid=100, tid=100, conn=1, method="GET", path="/a", t_ingress_ns=1 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=20 * MS)
    b = Request(pid=100, tid=100, conn=2, method="GET", path="/b", t_ingress_ns=10 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=30 * MS)
    g = summarize(events, requests=[a, b])
    (ga,) = g.requests
    assert (ga.index, ga.attributed_by, ga.gpu_wait_ns, ga.gpu_launches) == (0, "thread", MS, 5)


def test_allocations_while_serving_are_flagged():
    events = [decode(gpu_call(GpuFunction.CUDA_MALLOC, 5 * MS, 6 * MS, nbytes=1 << 20, addr=0x1000)),
              decode(gpu_call(GpuFunction.CUDA_FREE, 50 * MS, 51 * MS, addr=0x1000))]
    r = Request(pid=100, tid=100, conn=1, method="GET", path="/a", t_ingress_ns=1 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=20 * MS)
    g = summarize(events, requests=[r], wall_ns=1_000 * MS)
    (p,) = g.processes
    assert p.allocations == {"count": 1, "bytes": 1 << 20, "frees": 1, "per_s": 1.0, "during_requests": 1}
    assert [f.kind for f in g.findings] == ["alloc_churn"]


def test_histogram_p99_is_the_upper_edge_of_its_power_of_two_slot():
    hist = [0] * 32
    hist[11] = 99  # [1024, 2048) ns
    hist[20] = 1
    assert _hist_p99(hist) == 2048
    hist[20] = 2
    assert _hist_p99(hist) == 1 << 20
    assert _hist_p99([0] * 32) is None


def test_no_gpu_set_and_no_events_means_no_summary():
    assert summarize_gpu([], None, [], [], None, None) is None


def test_request_carries_each_attributed_wait_as_an_interval():
    events, steps = decode_step_loop(steps=4, launches=3, launch_ms=1, wait_ms=2, t0=10 * MS)
    server = ServerRequest(pid=100, req_id=7, tid=100, t_scheduled_ns=12 * MS, steps=steps[1:3])
    r = Request(pid=100, tid=100, conn=1, method="POST", path="/v1", t_ingress_ns=9 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=40 * MS, server=server)
    (rg,) = summarize(events, steps, [r]).requests
    # its steps' DtoH copies, exactly the time counted in gpu_wait_ns, named by function
    assert [(w.start_ns, w.end_ns) for w in rg.wait_intervals] == [
        (s.t_start_ns + MS, s.t_end_ns) for s in steps[1:3]]
    assert sum(w.end_ns - w.start_ns for w in rg.wait_intervals) == rg.gpu_wait_ns
    assert {(w.kind, w.what) for w in rg.wait_intervals} == {("gpu", "cudaMemcpy")}
