"""Latency decomposition: where each request's time went, phase by phase.

Phases are contiguous intervals between boundaries, so they always sum to
the request's end-to-end time (and the ones before the first token to its
TTFT). A boundary the recording lacks (a probe the server does not fire)
merges its phase into the next one; a boundary earlier than the previous
one (clocks are one clock here, but probes can be fired out of order by a
server) is clamped to it, so no phase is negative.

Boundaries, in order (docs/report-json.md, "phases"):
  t_ingress        the socket read that returned the request line
  ingress          -> request_queued (else request_start): body read, parse, tokenize;
                      with an engine read between its processes (engine_ipc), -> the hand-off
  handoff          -> the engine's QUEUED (engine_ipc only): the engine loop takes new
                      requests in between its steps, so this is mostly the step under way
  queue            -> request_scheduled: waiting for a batch slot / KV space
  schedule         -> prefill_start
  prefill          -> prefill_end
  first_token      -> the first token_emit: sampling and hand-off to the API layer
  network_flush    -> the first SSE write on the socket (streaming) [TTFT ends here]
  decode           -> the last token write (streaming) / the last token_emit (non-streaming)
  response         -> the write of the status line (non-streaming only)
  finish           -> the end of the response on the socket
Without USDT probes only the socket boundaries exist:
  response_headers -> the write of the status line
  first_token      -> the first SSE write (streaming)  [TTFT ends here]
  decode           -> the last SSE write (streaming)
  finish           -> the end of the response
"""

from __future__ import annotations

from inferprobe.collector.model.timeline import Request

TTFT_PHASES = ("ingress", "handoff", "queue", "schedule", "prefill", "response_headers", "first_token",
               "network_flush")
PHASES = (*TTFT_PHASES, "decode", "response", "finish")


def _boundaries(r: Request) -> list[tuple[str, int | None]]:
    """(phase that ends here, time) pairs in phase order."""
    s = r.server
    last_token_write = r.token_ns[-1] if r.token_ns else None
    if s is None:
        if r.streaming:
            return [("response_headers", r.t_response_start_ns), ("first_token", r.t_first_token_ns),
                    ("decode", last_token_write), ("finish", r.t_end_ns)]
        return [("response_headers", r.t_response_start_ns), ("finish", r.t_end_ns)]
    first_emit = s.token_ns[0] if s.token_ns else None
    queued = s.t_queued_ns if s.t_queued_ns is not None else s.t_start_ns
    taken_in = [("ingress", s.t_handoff_ns), ("handoff", queued)] if s.t_handoff_ns is not None \
        else [("ingress", queued)]
    head = [
        *taken_in,
        ("queue", s.t_scheduled_ns),
        ("schedule", s.t_prefill_start_ns),
        ("prefill", s.t_prefill_end_ns),
        ("first_token", first_emit),
    ]
    if r.streaming:
        return head + [("network_flush", r.t_first_token_ns), ("decode", last_token_write),
                       ("finish", r.t_end_ns)]
    last_emit = s.token_ns[-1] if s.token_ns else None
    return head + [("decode", last_emit), ("response", r.t_response_start_ns), ("finish", r.t_end_ns)]


def phases_ns(r: Request) -> dict[str, int]:
    """Phase name -> ns, in order, for the part of the request that happened.

    Stops at the last boundary seen: an aborted request has phases up to
    where it got.
    """
    out: dict[str, int] = {}
    previous = r.t_ingress_ns
    for name, t in _boundaries(r):
        if t is None:
            continue  # its time goes to the next phase that has an end
        t = max(t, previous)
        out[name] = t - previous
        previous = t
    return out


def ttft_phases_ns(r: Request) -> dict[str, int]:
    """The phases that make up the time to the first token write."""
    return {k: v for k, v in phases_ns(r).items() if k in TTFT_PHASES}
