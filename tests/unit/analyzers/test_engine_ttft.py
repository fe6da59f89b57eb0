"""The verdict on a server recorded from its sockets alone takes the engine's own
per-request phase histograms (scraped from its /metrics) for the split the
sockets cannot see, and advises in the engine's own flags."""

from __future__ import annotations

from inferprobe.analyzers.breakdown import break_down
from inferprobe.analyzers.engine_metrics import summarize
from inferprobe.analyzers.engine_ttft import engine_ttft_view
from inferprobe.analyzers.verdict import ttft_phase_finding
from inferprobe.collector.model.timeline import Outcome, Request

MS = 1_000_000
LABELS = {"engine": "0", "model_name": "smol"}
BOUNDS = (0.1, 0.5, 1.0, 5.0, float("inf"))


def _histogram(family: str, count: float, total: float, le_counts: tuple[float, ...]) -> list[list]:
    out = [[f"{family}_bucket", {**LABELS, "le": str(le)}, c]
           for le, c in zip(BOUNDS, le_counts, strict=True)]
    return out + [[f"{family}_count", LABELS, count], [f"{family}_sum", LABELS, total]]


def _scrape(t_ns: int, samples: list[list]) -> dict:
    return {"t_ns": t_ns, "url": "http://127.0.0.1:8000/metrics", "samples": samples, "local_ports": [40000]}


def _vllm_scrapes() -> list[dict]:
    """Before: 4 requests already served (0.4 s queued, 0.2 s prefill, 0.8 s TTFT in all). After:
    16 more, queued 48 s and prefilled 1.6 s in all, TTFT 52 s in all: the recording's own
    requests queued 3 s each on average, prefilled 0.1 s, waited 3.25 s for a first token."""
    before = (_histogram("vllm:request_queue_time_seconds", 4, 0.4, (4, 4, 4, 4, 4))
              + _histogram("vllm:request_prefill_time_seconds", 4, 0.2, (4, 4, 4, 4, 4))
              + _histogram("vllm:time_to_first_token_seconds", 4, 0.8, (0, 4, 4, 4, 4))
              + [["vllm:num_requests_waiting", LABELS, 0.0]])
    after = (_histogram("vllm:request_queue_time_seconds", 20, 48.4, (5, 5, 6, 16, 20))
             + _histogram("vllm:request_prefill_time_seconds", 20, 1.8, (18, 20, 20, 20, 20))
             + _histogram("vllm:time_to_first_token_seconds", 20, 52.8, (0, 5, 5, 15, 20))
             + [["vllm:num_requests_waiting", LABELS, 12.0]])
    return [_scrape(1_000, before), _scrape(2_000, after)]


def _socket_only_requests() -> list[Request]:
    """Streams whose first token comes long after the response headers, as an unmodified
    vLLM's do: the sockets alone put all of it 'between the headers and the first token'."""
    reqs = []
    for i in range(20):
        t0 = i * 10 * MS
        first = t0 + (100 + 200 * i) * MS
        reqs.append(Request(pid=1, tid=1, conn=i, method="POST", path="/v1/completions", t_ingress_ns=t0,
                            status=200, outcome=Outcome.COMPLETE, t_response_start_ns=t0 + MS,
                            token_ns=[first, first + 30 * MS], t_end_ns=first + 31 * MS, streaming=True))
    return reqs


def test_the_engines_own_split_is_read_from_its_histograms_growth():
    view = engine_ttft_view(summarize(_vllm_scrapes()))
    assert view is not None and view.engine == "vllm" and view.requests == 16
    assert view.queue_mean_s == 3.0 and view.prefill_mean_s == 0.1 and view.ttft_mean_s == 3.25
    assert round(view.queue_share, 3) == round(3.0 / 3.25, 3) and view.queue_dominates


def test_a_queueing_vllm_gets_its_own_numbers_and_knobs_not_usdt_advice():
    reqs = _socket_only_requests()
    finding = ttft_phase_finding(break_down(reqs), None, ("sockets",), summarize(_vllm_scrapes()))
    assert finding is not None
    assert "between the response headers and the first token" in finding.sentence
    assert "by vLLM's own account, its 16 requests spent on average 3000 ms in its queue and 100 ms in " \
           "prefill (92 % of its mean TTFT of 3250 ms queued)" in finding.sentence, finding.sentence
    assert "--max-num-seqs" in finding.recommendation and "USDT" not in finding.recommendation


def test_prefill_dominating_is_said_with_the_prefill_knob():
    scrapes = _vllm_scrapes()
    after = scrapes[1]["samples"]
    for sample in after:
        if sample[0] == "vllm:request_queue_time_seconds_sum":
            sample[2] = 0.4 + 0.8  # 50 ms queued each
        if sample[0] == "vllm:request_prefill_time_seconds_sum":
            sample[2] = 0.2 + 40.0  # 2.5 s of prefill each
    finding = ttft_phase_finding(break_down(_socket_only_requests()), None, ("sockets",), summarize(scrapes))
    assert finding is not None and "Prefill, not the queue, dominates in vLLM" in finding.recommendation
    assert "--max-num-batched-tokens" in finding.recommendation


def test_a_known_engine_without_phase_histograms_gets_its_own_flag():
    samples = [["llamacpp:requests_deferred", {}, 2.0], ["llamacpp:requests_processing", {}, 1.0]]
    summary = summarize([_scrape(1_000, samples), _scrape(2_000, samples)])
    assert engine_ttft_view(summary) is None
    finding = ttft_phase_finding(break_down(_socket_only_requests()), None, ("sockets",), summary)
    assert finding is not None and "-np" in finding.recommendation and "USDT" not in finding.recommendation
    assert "waiting-queue gauge peaked at 2" in finding.recommendation


def test_an_unknown_server_is_still_told_how_to_split_it():
    finding = ttft_phase_finding(break_down(_socket_only_requests()), None, ("sockets",), None)
    assert finding is not None and "USDT probes" in finding.recommendation


def _real_vllm_scrapes() -> list[dict]:
    """A real vLLM CPU 0.32.0 on --max-num-seqs 4, scraped before and after 16 concurrent
    streams (tests/fixtures/engine_metrics/vllm-0.32.0-*-burst.prom)."""
    from pathlib import Path

    from inferprobe.collector.attach.engine_scrape import parse_exposition

    fixtures = Path(__file__).parents[2] / "fixtures" / "engine_metrics"
    return [_scrape(t, parse_exposition((fixtures / f"vllm-0.32.0-{when}-burst.prom").read_text())[0])
            for t, when in ((1_000, "before"), (2_000, "after"))]


def test_a_real_vllm_burst_is_read_as_queueing():
    # 12 of the 16 streams waited for one of 4 places: vLLM's own histograms grew by 16
    # requests, 24.48 s queued and 0.966 s of prefill in all (the _sum deltas of the files).
    view = engine_ttft_view(summarize(_real_vllm_scrapes()))
    assert view is not None and view.engine == "vllm" and view.requests == 16
    assert abs(view.queue_mean_s - (24.540070058967103 - 5.590299406321719e-05) / 16) < 1e-9
    assert abs(view.prefill_mean_s - (1.3778760119967046 - 0.4119574350042967) / 16) < 1e-9
    assert view.queue_dominates
    finding = ttft_phase_finding(break_down(_socket_only_requests()), None, ("sockets",),
                                 summarize(_real_vllm_scrapes()))
    assert finding is not None and "--max-num-seqs" in finding.recommendation
    assert "by vLLM's own account, its 16 requests spent on average 1534 ms in its queue" in finding.sentence
