"""analyzers/gpu_execution.py over constructed CUPTI shim records: clock mapping, the correlation-id join,
per-request and per-step GPU busy time and idle gaps, the launch -> first-token path, the kernel table.

The records are built as the kernel writes them (bytes of the structs in bpf/inferprobe.h) and decoded,
so the analyzer sees exactly what a recording would give it. The GPU side itself is checked on hardware
by benchmarks/gpu_check.py (docs/gpu.md)."""

from __future__ import annotations

import random

import pytest

from inferprobe.analyzers import gpu_execution as gx
from inferprobe.analyzers.gpu import summarize_gpu
from inferprobe.collector.model import events as ev
from inferprobe.collector.model.layout_generated import GPU_OTHER_KERNEL_NAME_ID
from inferprobe.collector.model.timeline import DecodeStep, Outcome, Request, ServerRequest

US = 1_000
MS = 1_000_000
PID, ENGINE_TID = 100, 101
# CUPTI's clock on Linux reads like wall time; this one also runs 20 ppm fast against CLOCK_MONOTONIC.
EPOCH, DRIFT_PPM = 1_796_143_336_562_635_032, 20


def cupti(mono_ns: int) -> int:
    return EPOCH + mono_ns + mono_ns * DRIFT_PPM // 1_000_000  # integers: a float's step here is 256 ns


def _hdr(e, etype: ev.EventType, ts: int, pid: int, tid: int):
    e.hdr.type, e.hdr.pid, e.hdr.tid, e.hdr.ts_ns = etype, pid, tid, ts
    return e


def clock(mono_ns: int, pid: int = PID, window_ns: int = 2 * US) -> ev.GpuClockRecord:
    e = _hdr(ev.GpuClockEvent(), ev.EventType.GPU_CLOCK, mono_ns, pid, pid + 50)
    e.cupti_ns = cupti(mono_ns)
    e.mono_before_ns, e.mono_after_ns = mono_ns - window_ns // 2, mono_ns + window_ns // 2
    return ev.decode(bytes(e))


def api(correlation: int, ts: int, tid: int = ENGINE_TID, pid: int = PID, cbid: int = 211,
        domain: int = 2) -> ev.GpuApiRecord:
    e = _hdr(ev.GpuApiEvent(), ev.EventType.GPU_API, ts, pid, tid)
    e.correlation_id, e.cbid, e.domain = correlation, cbid, domain
    return ev.decode(bytes(e))


def activity(correlation: int, start_ns: int, end_ns: int, *, kind=ev.GpuActivityKind.KERNEL,
             name_id: int = 1, stream: int = 7, pid: int = PID, shape: int = 0) -> ev.GpuActivityRecord:
    """start_ns/end_ns on the monotonic timeline; the record carries them in CUPTI's clock."""
    e = _hdr(ev.GpuActivityEvent(), ev.EventType.GPU_ACTIVITY, end_ns + MS, pid, pid + 60)
    e.kind, e.gpu_start, e.gpu_end, e.correlation_id = kind, cupti(start_ns), cupti(end_ns), correlation
    e.stream, e.name_id, e.shape = stream, name_id, shape
    return ev.decode(bytes(e))


def kernel_name(name_id: int, name: str, pid: int = PID) -> ev.GpuKernelNameRecord:
    e = _hdr(ev.GpuKernelNameEvent(), ev.EventType.GPU_KERNEL_NAME, 0, pid, pid + 60)
    e.name_id, e.len = name_id, len(name)
    e.name = name.encode()
    return ev.decode(bytes(e))


def status(text: str, code=ev.GpuShimStatus.COLLECTING, pid: int = PID) -> ev.GpuShimStatusRecord:
    e = _hdr(ev.GpuShimStatusEvent(), ev.EventType.GPU_SHIM_STATUS, 1, pid, pid + 60)
    e.status, e.len, e.text = code, len(text), text.encode()
    return ev.decode(bytes(e))


def clocks_over(t0: int, t1: int, pid: int = PID) -> list[ev.GpuClockRecord]:
    # from t0 + 1 µs: a pairing's first read is 1 µs before its midpoint
    return [clock(t, pid) for t in range(t0 + US, t1 + 1, max(1, (t1 - t0) // 5))]


# -- clock ---------------------------------------------------------------------------------------------


def test_the_clock_fit_maps_a_drifting_cupti_clock_onto_monotonic_within_the_pairing_window():
    pairs = clocks_over(0, 10_000 * MS)
    m = gx.ClockMap.fit(pairs)
    assert m is not None and m.pairs == len(pairs)
    for t in (0, 1234 * MS, 9_999 * MS, 12_000 * MS):  # also past the last pairing
        assert abs(m.to_mono(cupti(t)) - t) <= 2
    assert m.max_residual_ns <= 1 * US + 2


def test_one_pairing_gives_an_offset_and_no_drift_correction():
    m = gx.ClockMap.fit([clock(5 * MS)])
    assert m.slope == 1.0 and m.pairs == 1
    assert m.to_mono(cupti(5 * MS)) == 5 * MS
    # 1 ms later the uncorrected 20 ppm drift is 20 ns: what one pairing cannot know
    assert abs(m.to_mono(cupti(6 * MS)) - 6 * MS) == 20


# -- join ----------------------------------------------------------------------------------------------


def test_activity_records_join_their_launch_by_process_and_correlation_id():
    names = [kernel_name(1, "gemm"), kernel_name(2, "softmax")]
    acts = [activity(10, 5 * MS, 6 * MS, name_id=1), activity(11, 6 * MS, 6 * MS + 300 * US, name_id=2),
            activity(12, 7 * MS, 7 * MS + 10 * US, kind=ev.GpuActivityKind.MEMCPY, name_id=2),  # DtoH
            activity(99, 8 * MS, 9 * MS, name_id=1),  # launched before the shim started: no api record
            activity(10, 5 * MS, 6 * MS, pid=200)]  # another process, same id, and no clock pairing there
    apis = [api(10, 4 * MS), api(11, 4 * MS + 50 * US), api(12, 4 * MS + 90 * US, tid=102),
            api(10, 4 * MS + 5 * US, tid=999, domain=1),  # the driver call inside the runtime call
            api(10, 3 * MS, pid=300)]
    random.Random(1).shuffle(acts)
    joined = gx.join(acts, apis, clocks_over(0, 10 * MS), names)
    assert (joined.joined, joined.without_launch, joined.without_clock) == (3, 1, 1)
    got = [(x.correlation_id, x.name, x.launch_tid, x.launch_ns, x.start_ns, x.end_ns)
           for x in joined.executions]
    assert got == [
        (10, "gemm", ENGINE_TID, 4 * MS, 5 * MS, 6 * MS),
        (11, "softmax", ENGINE_TID, 4 * MS + 50 * US, 6 * MS, 6 * MS + 300 * US),
        (12, "memcpy DtoH", 102, 4 * MS + 90 * US, 7 * MS, 7 * MS + 10 * US),
        (99, "gemm", None, None, 8 * MS, 9 * MS),
    ]


def test_kernels_past_the_shims_name_table_and_unseen_names_are_said_to_be_so():
    joined = gx.join([activity(1, MS, 2 * MS, name_id=GPU_OTHER_KERNEL_NAME_ID),
                      activity(2, MS, 2 * MS, name_id=5)], [], [clock(MS)], [])
    assert sorted(x.name for x in joined.executions) == ["(kernel name 5 not seen)", gx.OTHER_KERNELS]


# -- windows -------------------------------------------------------------------------------------------


def test_busy_time_counts_overlapping_streams_once_and_the_gaps_are_idle():
    execs = gx.join([activity(1, 0, 4 * MS), activity(2, 2 * MS, 5 * MS, stream=8),  # overlap 2..4
                     activity(3, 7 * MS, 8 * MS), activity(4, 11 * MS, 12 * MS)],
                    [api(i, 0) for i in range(1, 5)], clocks_over(0, 20 * MS), []).executions
    w = gx.window_gpu(execs)
    assert (w.busy_ns, w.span_ns, w.idle_ns, w.largest_gap_ns) == (7 * MS, 12 * MS, 5 * MS, 3 * MS)
    assert w.kernel_ns == 9 * MS and w.kernels == 4
    assert w.busy == ((0, 5 * MS), (7 * MS, 8 * MS), (11 * MS, 12 * MS))
    assert w.idle_share == pytest.approx(5 / 12)


def decode_loop(t0: int, steps: int, kernels: int, kernel_us: int, gap_us: int, first_id: int = 1):
    """An engine thread: per step, `kernels` launches 20 µs apart; the GPU runs each for kernel_us with
    gap_us between them (the CPU launching slower than the GPU runs); a 1 ms step."""
    acts, apis, step_list = [], [], []
    cid = first_id
    for i in range(steps):
        start = t0 + i * MS
        gpu_t = start + 100 * US
        for k in range(kernels):
            apis.append(api(cid, start + 10 * US + k * 20 * US))
            acts.append(activity(cid, gpu_t, gpu_t + kernel_us * US, name_id=1 + k % 2))
            gpu_t += (kernel_us + gap_us) * US
            cid += 1
        step_list.append(DecodeStep(pid=PID, tid=ENGINE_TID, step_id=i, t_start_ns=start,
                                    t_end_ns=start + MS - 1, batch_size=1, tokens_in_batch=1))
    return acts, apis, step_list


def test_a_request_gets_the_gpu_time_of_its_own_decode_steps_with_its_idle_gaps_and_first_token_path():
    acts, apis, steps = decode_loop(10 * MS, steps=6, kernels=4, kernel_us=100, gap_us=50)
    # The request took part in steps 1..3; its first token left at 12.9 ms (after step 1's GPU work).
    server = ServerRequest(pid=PID, req_id=7, tid=PID, t_scheduled_ns=11 * MS, steps=steps[1:4])
    r = Request(pid=PID, tid=PID, conn=1, method="POST", path="/v1", t_ingress_ns=10 * MS + 500 * US,
                outcome=Outcome.COMPLETE, t_end_ns=14 * MS, token_ns=[11 * MS + 900 * US], server=server)
    other = Request(pid=PID, tid=PID, conn=2, method="POST", path="/v1", t_ingress_ns=13 * MS,
                    outcome=Outcome.COMPLETE, t_end_ns=16 * MS)
    names = [kernel_name(1, "a"), kernel_name(2, "b")]
    execs = gx.join(acts, apis, clocks_over(0, 20 * MS), names).executions
    (rg, _) = gx.per_request([r, other], execs)
    assert rg.index == 0 and rg.attributed_by == "decode_steps"
    # 3 steps x 4 kernels of 100 µs, 3 gaps of 50 µs within each step, and the gaps between steps
    assert rg.gpu.kernels == 12 and rg.gpu.busy_ns == 12 * 100 * US
    step_gpu_span = 4 * 100 * US + 3 * 50 * US
    assert rg.gpu.span_ns == 2 * MS + step_gpu_span
    assert rg.gpu.idle_ns == rg.gpu.span_ns - rg.gpu.busy_ns
    assert rg.gpu.largest_gap_ns == MS - step_gpu_span
    # launch -> first token: step 1's first launch at 11.01 ms, its GPU work from 11.1 ms to 11.65 ms
    assert rg.t_first_launch_ns == 11 * MS + 10 * US
    assert rg.first_gpu_start_ns == 11 * MS + 100 * US and rg.launch_queue_ns == 90 * US
    assert rg.gpu_before_first_token_ns == 4 * 100 * US
    assert rg.last_gpu_end_to_first_token_ns == 11 * MS + 900 * US - (11 * MS + 100 * US + step_gpu_span)
    assert rg.concurrent == 1  # `other` overlaps its steps


def test_without_usdt_a_request_gets_what_its_process_launched_during_it():
    acts, apis, _ = decode_loop(10 * MS, steps=3, kernels=2, kernel_us=100, gap_us=0)
    acts.append(activity(500, 11 * MS, 12 * MS, pid=200))  # another process: never this request's
    apis.append(api(500, 10 * MS + 200 * US, pid=200))
    r = Request(pid=PID, tid=PID, conn=1, method="POST", path="/v1", t_ingress_ns=10 * MS,
                outcome=Outcome.COMPLETE, t_end_ns=11 * MS + 500 * US, token_ns=[11 * MS + 400 * US])
    execs = gx.join(acts, apis, clocks_over(0, 20 * MS) + clocks_over(0, 20 * MS, pid=200), []).executions
    (rg,) = gx.per_request([r], execs)
    assert rg.attributed_by == "request_window"
    assert rg.gpu.executions == 4 and rg.gpu.busy_ns == 4 * 100 * US  # steps 0 and 1 launched in it
    assert rg.concurrent == 0


def test_a_step_that_keeps_the_gpu_busy_a_small_share_of_its_time_is_cpu_bound():
    acts, apis, steps = decode_loop(0, steps=4, kernels=5, kernel_us=20, gap_us=80)
    execs = gx.join(acts, apis, clocks_over(0, 5 * MS), []).executions
    out = gx.per_step([(s.pid, s.tid, s.t_start_ns, s.t_end_ns) for s in steps], execs)
    assert [s.gpu.kernels for s in out] == [5] * 4
    assert all(s.gpu_busy_share == pytest.approx(100 * US / (MS - 1)) for s in out)
    assert all(s.gpu.idle_ns == 4 * 80 * US for s in out)
    idle = gx.per_step([(PID, ENGINE_TID, 50 * MS, 51 * MS)], execs)
    assert idle[0].gpu is None and idle[0].gpu_busy_share == 0.0


# -- kernels -------------------------------------------------------------------------------------------


def test_the_kernel_table_is_bounded_and_keeps_every_nanosecond():
    acts, names = [], []
    for i in range(1, 101):
        names.append(kernel_name(i, f"kernel_{i}"))
        acts.append(activity(i, i * MS, i * MS + i * US, name_id=i))
    execs = gx.join(acts, [], clocks_over(0, 200 * MS), names).executions
    rows = gx.kernel_table(execs, max_rows=30)
    assert len(rows) == 30
    assert [r.name for r in rows[:3]] == ["kernel_100", "kernel_99", "kernel_98"]
    assert rows[-1].name == gx.OTHER_KERNELS and rows[-1].count == 71
    assert sum(r.total_ns for r in rows) == sum(x.duration_ns for x in execs)
    assert rows[-1].max_ns == 71 * US


# -- in the GPU summary --------------------------------------------------------------------------------


def test_summarize_gpu_carries_the_execution_summary_only_where_the_shim_was():
    acts, apis, steps = decode_loop(0, steps=3, kernels=2, kernel_us=100, gap_us=10)
    shim = [*acts, *apis, *clocks_over(0, 5 * MS), status("CUPTI is recording ... in pid 100")]
    g = summarize_gpu(shim, None, [], steps, None, "test")
    assert g.execution is not None and g.execution.collecting
    assert (g.execution.records, g.execution.joined) == (6, 6)
    assert g.execution.busy_ns == 6 * 100 * US
    assert g.execution.shim == {PID: "CUPTI is recording ... in pid 100"}
    assert [s.gpu.kernels for s in g.execution.steps] == [2, 2, 2]
    no_device = summarize_gpu([status("CUPTI found no CUDA device in pid 100", ev.GpuShimStatus.NO_DEVICE)],
                              None, [], [], None, "test")
    assert no_device.execution is not None and not no_device.execution.collecting
    assert no_device.execution.records == 0
    assert summarize_gpu([], {"mode": "auto"}, [], [], None, "test").execution is None
