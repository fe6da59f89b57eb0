"""The engine's own /metrics in the Prometheus export and in top, labelled by their source."""

from __future__ import annotations

from pathlib import Path

from inferprobe.analyzers.live import LiveWindow
from inferprobe.collector.attach.engine_scrape import parse_exposition
from inferprobe.collector.model.events import EventType, UsdtProbe, UsdtRecord
from inferprobe.exporters.metrics import Metrics
from inferprobe.reports.terminal_top import plain_line

FIXTURES = Path(__file__).parents[2] / "fixtures" / "engine_metrics"


def _samples(name: str) -> list[list]:
    return parse_exposition((FIXTURES / name).read_text())[0]


def test_engine_gauges_are_exported_beside_the_usdt_ones_with_their_source():
    m = Metrics({10: "vllm"})
    m.observe_engine(_samples("vllm.prom"))
    m.observe_usdt(UsdtRecord(type=EventType.USDT, pid=10, tid=10, ts_ns=1, probe=UsdtProbe.QUEUE_DEPTH,
                              args=(1, 2)))

    def sample(name: str, source: str) -> float | None:
        return m.registry.get_sample_value(name, {"target": "vllm", "source": source})

    assert sample("scheduler_queue_length", "engine_metrics") == 3
    assert sample("inferprobe_running_requests", "engine_metrics") == 8
    assert sample("token_occupancy_ratio", "engine_metrics") == 0.42
    assert sample("scheduler_queue_length", "usdt") == 1


def test_top_shows_the_engine_gauges_and_leaves_out_its_own_scrapes():
    window = LiveWindow(window_s=10)
    window.feed_engine({"samples": _samples("tgi.prom"), "local_ports": [45000]})
    snap = window.snapshot(now_ns=10**9)
    assert (snap.queue_waiting, snap.queue_running, snap.kv_occupancy) == (7, 4, None)
    assert snap.gauge_source == "engine_metrics"
    line = plain_line(snap, 1.0)
    assert "queue=7 running=4" in line and "gauges_from=engine_metrics" in line
    # the server's own probes win over the sampled endpoint
    window.feed(UsdtRecord(type=EventType.USDT, pid=1, tid=1, ts_ns=1, probe=UsdtProbe.QUEUE_DEPTH,
                           args=(2, 1)))
    window.feed_engine({"samples": _samples("tgi.prom"), "local_ports": [45000]})
    snap = window.snapshot(now_ns=10**9)
    assert (snap.queue_waiting, snap.gauge_source) == (2, "usdt")


def test_llama_steps_give_running_sequences_and_stalls_live():
    from inferprobe.collector.model.events import LlamaRunRecord, LlamaStepPhase, LlamaStepRecord

    m = Metrics({7: "llama-server"})

    def step(t_ms: int, end_ms: int, *seqs: int) -> None:
        runs = tuple(LlamaRunRecord(s, 10, 1, True) for s in seqs)
        for phase, t in ((LlamaStepPhase.ENTER, t_ms), (LlamaStepPhase.RETURN, end_ms)):
            m.observe_llama(LlamaStepRecord(EventType.LLAMA_STEP, 7, 8, t * 1_000_000, phase, len(runs),
                                            runs if phase == LlamaStepPhase.ENTER else (), False, 0, 1))

    step(0, 10, 0, 1)
    step(30, 40, 1)  # shares sequence 1: a 20 ms stall
    step(41, 50, 2)  # nothing shared: no stall
    labels = {"target": "llama-server", "source": "engine_uprobes"}
    assert m.registry.get_sample_value("inferprobe_running_requests", labels) == 1
    assert m.registry.get_sample_value("batch_stall_duration_seconds_count", labels) == 1
    assert abs(m.registry.get_sample_value("batch_stall_duration_seconds_sum", labels) - 0.020) < 1e-9
