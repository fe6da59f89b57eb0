"""Closed-loop streaming load against an OpenAI-style server, measured by the client.

Keeps N streaming requests in flight (N keep-alive connections, each sending
its next request as soon as the previous one ended) for a duration or a
request count, and measures every request itself: time to first token (TTFT,
send -> first SSE data event), inter-token latency (ITL, between consecutive
data events) and end-to-end latency (E2E, send -> end of response). All
timestamps are CLOCK_MONOTONIC nanoseconds, the clock the kernel tracer uses,
so a recording and this client's JSON can be compared directly.

Each request carries a decimal ``X-Request-Id``; the demo server uses it as
the request id it passes to its USDT probes, which lets a test join the
tracer's view of a request with the client's.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from urllib.parse import urlsplit

# Nearest rank, as every figure of the report: the client's p99 and the tracer's are one statistic.
from inferprobe.analyzers.cadence import percentile
from inferprobe.collector.errors import InferprobeError
from inferprobe.demo.sse_client import ClientResult, run_load

# Prompts of different lengths, taken in turn, so a decode batch mixes
# sequence lengths (and so exercises the padding) as real traffic does.
# Completion-style openings: the instruct model ends a bare instruction at once.
PROMPTS = (
    "Once upon a time, in a small village by the sea,",
    "The three most important things about learning to cook are",
    "Here is a short poem about the moon:\n",
    "A good way to explain how a bicycle stays upright to a child who has just learned to ride "
    "without training wheels is",
)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    base_path: str  # "" or a prefix such as "/proxy"


def parse_url(url: str) -> Target:
    """http://host:port[/prefix] -> Target; anything else is a usage error."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise InferprobeError(f"--url must look like http://127.0.0.1:8000, not {url!r}", exit_code=2)
    try:
        port = parts.port or 80
    except ValueError:
        raise InferprobeError(f"--url has an invalid port: {url!r}", exit_code=2) from None
    return Target(parts.hostname, port, parts.path.rstrip("/"))


class RequestIds:
    """Decimal request ids, unique across runs: milliseconds since the epoch x 1000 + n.

    Starting from the wall clock keeps two runs against one server from
    reusing ids (the server passes them to its probes); they stay far below
    2**63, the probes' signed 64-bit range.
    """

    def __init__(self, start: int | None = None) -> None:
        self._next = itertools.count(start if start is not None else time.time_ns() // 1_000_000 * 1000)
        self._lock = threading.Lock()

    def __call__(self, _conn: int, _index: int) -> str:
        with self._lock:
            return str(next(self._next))


def body_factory(path: str, prompts: tuple[str, ...], max_tokens: int) -> Callable[[int, int], dict]:
    def make(conn: int, index: int) -> dict:
        prompt = prompts[(conn + index) % len(prompts)]
        body: dict = {"max_tokens": max_tokens, "stream": True,
                      "stream_options": {"include_usage": True}}
        if path.endswith("/chat/completions"):
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    return make


def token_events(result: ClientResult) -> list[int]:
    """Receive times of the SSE events that carried a token.

    The OpenAI stream ends with a chunk that only carries finish_reason and,
    when asked for, one that only carries usage: neither is a token.
    """
    times = []
    for t_ns, payload in zip(result.t_event_ns, result.events, strict=True):
        try:
            choices = json.loads(payload).get("choices") or []
        except ValueError:
            continue
        if choices and choices[0].get("finish_reason") is None:
            times.append(t_ns)
    return times


def _ok(r: ClientResult) -> bool:
    return r.error is None and not r.aborted and r.status == 200


def summarize(results: list[ClientResult], wall_s: float,
              tokens_of: Callable[[ClientResult], list[int]] = lambda r: r.t_event_ns) -> dict:
    """Counts, throughput and TTFT / ITL / E2E percentiles in milliseconds.

    ``tokens_of`` picks the receive times that count as tokens (all SSE data
    events by default; ``token_events`` for OpenAI streams).
    """
    ok = [r for r in results if _ok(r)]
    toks = {id(r): tokens_of(r) for r in results}
    ttft = [(toks[id(r)][0] - r.t_send_ns) / 1e6 for r in ok if toks[id(r)]]
    itl = [(b - a) / 1e6 for r in ok for a, b in pairwise(toks[id(r)])]
    e2e = [(r.t_end_ns - r.t_send_ns) / 1e6 for r in ok if r.t_end_ns]
    tokens = sum(len(t) for t in toks.values())

    def rnd(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    out = {
        "requests": len(results),
        "completed": len(ok),
        "aborted": sum(r.aborted for r in results),
        "errors": sum(r.error is not None for r in results),
        "non_200": sum(r.status is not None and r.status != 200 for r in results),
        "tokens": tokens,
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(ok) / wall_s, 2) if wall_s else None,
        "tokens_per_s": round(tokens / wall_s, 2) if wall_s else None,
    }
    for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        for p in (50, 90, 99):
            out[f"{name}_ms_p{p}"] = rnd(percentile(values, p))
    return out


def per_request(results: list[ClientResult]) -> list[dict]:
    """One JSON-ready record per request: client timestamps only, no text."""
    rows = []
    for r in results:
        tokens = token_events(r)
        rows.append({
            "request_id": r.request_id,
            "status": r.status,
            "ok": _ok(r),
            "aborted": r.aborted,
            "error": r.error,
            "tokens": len(tokens),
            "t_send_ns": r.t_send_ns,
            "t_first_byte_ns": r.t_first_byte_ns,
            "t_token_ns": tokens,
            "t_done_ns": r.t_done_ns,
            "t_end_ns": r.t_end_ns,
        })
    return rows


def run(url: str, *, concurrency: int, duration_s: float | None = None, count: int | None = None,
        max_tokens: int = 32, path: str = "/v1/completions", prompts: tuple[str, ...] = PROMPTS,
        timeout_s: float = 120.0, ids: RequestIds | None = None) -> tuple[list[ClientResult], float]:
    """Drive the load; returns (results, wall seconds)."""
    target = parse_url(url)
    t0 = time.monotonic()
    results = run_load(
        target.host, target.port,
        connections=concurrency,
        duration_s=duration_s,
        total_requests=count,
        body_factory=body_factory(path, prompts, max_tokens),
        path=target.base_path + path,
        timeout=timeout_s,
        request_id=ids or RequestIds(),
    )
    return results, time.monotonic() - t0


def format_summary(s: dict) -> str:
    def ms(key: str) -> str:
        v = s[key]
        return "-" if v is None else f"{v:.1f}"

    lines = [
        f"requests {s['requests']}  completed {s['completed']}  aborted {s['aborted']}  "
        f"errors {s['errors']}  non-200 {s['non_200']}",
        f"tokens {s['tokens']} in {s['wall_s']:.1f} s: {s['tokens_per_s']} tokens/s, "
        f"{s['requests_per_s']} requests/s",
        f"{'ms':<6}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for name in ("ttft", "itl", "e2e"):
        lines.append(f"{name.upper():<6}" + "".join(f"{ms(f'{name}_ms_p{p}'):>10}" for p in (50, 90, 99)))
    return "\n".join(lines)


def write_json(path: Path, summary: dict, results: list[ClientResult], meta: dict) -> None:
    doc = {"meta": meta, "summary": summary, "requests": per_request(results)}
    path.write_text(json.dumps(doc, indent=1) + "\n")
