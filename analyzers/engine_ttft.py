"""Where an engine's TTFT went by its own account, and the knobs it takes.

A server recorded from its sockets alone (no inferprobe USDT probes, no engine
uprobes: an unmodified vLLM or TGI) gives the verdict only "between the
response headers and the first token". The engine itself publishes, per
request, the time spent in its queue and in prefill (analyzers/
engine_metrics.py, ENGINE_PHASES), and `record` scraped them: their growth
over the recording is the split the sockets cannot see, for the requests
that ended while recording. Means, not percentiles of one request: the
histograms' buckets are too coarse for a p99 of one phase to be more than a
bucket's bounds.

Advice is in the engine's own flags (never advice it cannot take, such as
loading inferprobe's USDT probes into vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferprobe.analyzers.engine_metrics import (
    INFERENCE_PHASE,
    PREFILL_PHASE,
    QUEUE,
    QUEUE_PHASE,
    EngineMetricsSummary,
)
from inferprobe.analyzers.units import ms_text

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "tgi": "TGI"}
# engine -> (what to do when requests queue, what to do when prefill dominates)
ENGINE_KNOBS: dict[str, tuple[str, str]] = {
    "vllm": ("raise --max-num-seqs (more sequences per step) and --max-num-batched-tokens if memory allows, "
             "or add replicas",
             "lower --max-num-batched-tokens so long prompts are prefilled in chunks between decode steps, "
             "and enable prefix caching where prompts share a prefix"),
    "sglang": ("raise --max-running-requests if memory allows, or add replicas",
               "set --chunked-prefill-size so long prompts are prefilled in chunks, and keep the radix "
               "cache on where prompts share a prefix"),
    "llamacpp": ("raise -np (parallel slots; each takes its share of -c), or add replicas",
                 "raise -b/-ub (tokens per step) so a prompt takes fewer steps, and keep cache_prompt on"),
    "tgi": ("raise --max-batch-total-tokens (or --max-batch-size) if memory allows, or add replicas",
            "lower --max-batch-prefill-tokens so prefills share steps with decoding"),
}


@dataclass(frozen=True)
class EngineTtftView:
    engine: str  # ENGINE_NAMES key
    requests: int  # the requests the histograms counted while recording
    queue_mean_s: float | None
    prefill_mean_s: float | None  # vLLM's prefill; TGI's whole inference (prefill and decode)
    ttft_mean_s: float | None  # the engine's own TTFT histogram's mean, where published
    prefill_label: str  # "prefill", or "inference" (TGI: prefill and decode together)

    @property
    def queue_share(self) -> float | None:
        """The queue's share of the engine's own mean TTFT."""
        if self.queue_mean_s is None or not self.ttft_mean_s:
            return None
        return min(1.0, self.queue_mean_s / self.ttft_mean_s)

    @property
    def queue_dominates(self) -> bool:
        return self.queue_mean_s is not None and self.queue_mean_s >= (self.prefill_mean_s or 0.0)

    def sentence(self) -> str:
        name = ENGINE_NAMES[self.engine]
        parts = []
        if self.queue_mean_s is not None:
            parts.append(f"{ms_text(int(self.queue_mean_s * 1e9))} in its queue")
        if self.prefill_mean_s is not None:
            parts.append(f"{ms_text(int(self.prefill_mean_s * 1e9))} in {self.prefill_label}")
        share = self.queue_share
        of_ttft = (f" ({round(share * 100)} % of its mean TTFT of {ms_text(int(self.ttft_mean_s * 1e9))} "
                   f"queued)" if share is not None and self.ttft_mean_s else "")
        return (f"by {name}'s own account, its {self.requests:g} requests spent on average "
                f"{' and '.join(parts)}{of_ttft}")

    def recommendation(self) -> str:
        queue_knob, prefill_knob = ENGINE_KNOBS[self.engine]
        name = ENGINE_NAMES[self.engine]
        if self.queue_dominates:
            return f"Requests wait in {name}'s queue: {queue_knob}."
        return f"Prefill, not the queue, dominates in {name}: {prefill_knob}."


def engine_ttft_view(summary: EngineMetricsSummary | None) -> EngineTtftView | None:
    """The engine's own queue/prefill split over the recording; None where it published none."""
    if summary is None or summary.engine not in ENGINE_KNOBS:
        return None
    queue = summary.phases.get(QUEUE_PHASE)
    prefill = summary.phases.get(PREFILL_PHASE) or summary.phases.get(INFERENCE_PHASE)
    if queue is None and prefill is None:
        return None
    counted = max(h.count for h in (queue, prefill) if h is not None)
    ttft = summary.ttft.mean if summary.ttft is not None else None
    label = PREFILL_PHASE if PREFILL_PHASE in summary.phases else "inference (prefill and decode)"
    return EngineTtftView(summary.engine, int(counted), queue.mean if queue else None,
                          prefill.mean if prefill else None, ttft, label)


def engine_advice(summary: EngineMetricsSummary | None) -> str | None:
    """For a known engine that published no per-request phases: its queue knob, said with
    its waiting-queue gauge where scraped. None for an unknown engine."""
    if summary is None or summary.engine not in ENGINE_KNOBS:
        return None
    name = ENGINE_NAMES[summary.engine]
    peak = summary.peak(QUEUE)
    seen = (f"its waiting-queue gauge peaked at {peak:g}" if peak is not None
            else "it published no waiting-queue gauge")
    return (f"{name} published no per-request queue time in this recording ({seen}); if requests queue, "
            f"{ENGINE_KNOBS[summary.engine][0]}.")
