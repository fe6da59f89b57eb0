"""The fixed closed-loop load the batching-advice checks run at each setting, and
what its clients measure of it themselves (CLOCK_MONOTONIC, the tracer's clock).

Clients start one after another (a ramp, so the engine runs at every batch
size up to its cap and the fit has a slope to see) and ask for outputs of
four lengths in turn (real traffic is not one length, and requests that end
at different steps leave and join the batch between steps).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass

from inferprobe.analyzers.cadence import percentile
from inferprobe.demo.loadgen import PROMPTS, token_events
from inferprobe.demo.sse_client import ClientResult, connect, request_once


@dataclass(frozen=True)
class LoadShape:
    clients: int
    per_client: int
    output_lengths: tuple[int, ...]  # taken in turn
    stagger_s: float = 0.4

    def body(self, conn: int, index: int) -> dict:
        # greedy, the end-of-text token ignored and no prompt cache where the server has them
        # (llama.cpp): each setting's run asks for the same work
        lengths = self.output_lengths
        return {"prompt": PROMPTS[(conn + index) % len(PROMPTS)],
                "max_tokens": lengths[(conn * 3 + index) % len(lengths)],
                "stream": True, "temperature": 0, "ignore_eos": True, "cache_prompt": False}


@dataclass(frozen=True)
class Measured:
    ttft_ns: list[int]
    itl_ns: list[int]
    requests: int
    # where each gap in itl_ns ended (the client's clock): gaps that end together came
    # from one engine step, and are one event to the p99's interval (turns_of)
    itl_end_ns: list[int]

    @property
    def ttft_p99_ns(self) -> int:
        return int(percentile(self.ttft_ns, 99) or 0)

    @property
    def itl_p99_ns(self) -> int:
        return int(percentile(self.itl_ns, 99) or 0)

    @property
    def ttft_p99_interval_ns(self) -> tuple[int, int]:
        return p99_interval(self.ttft_ns)

    @property
    def itl_p99_interval_ns(self) -> tuple[int, int]:
        return p99_interval(self.itl_ns, turns_of(self.itl_end_ns, self.itl_ns))

    def as_text(self) -> str:
        return json.dumps({"requests": self.requests, "ttft_p99_ms": self.ttft_p99_ns / 1e6,
                           "itl_p99_ms": self.itl_p99_ns / 1e6,
                           "ttft_p99_interval_ms": [v / 1e6 for v in self.ttft_p99_interval_ns],
                           "itl_p99_interval_ms": [v / 1e6 for v in self.itl_p99_interval_ns],
                           "ttft_p50_ms": (percentile(self.ttft_ns, 50) or 0) / 1e6,
                           "itl_p50_ms": (percentile(self.itl_ns, 50) or 0) / 1e6})


def p99_interval(values: list[int], clusters: list[int] | None = None) -> tuple[int, int]:
    """The measured p99's own 95 % interval, distribution-free: the order statistics
    around its rank, n*0.99 +- 1.96 * sqrt(variance of the count of values above it).
    Of 108 TTFTs the p99 is the 107th value and could as well have been the 105th or the
    108th (the maximum): one slow request more or less moves it by a tenth on these
    loads, as much as the bound it is checked against.

    For independent values that variance is the binomial n*0.99*0.01. ITL gaps are not
    independent: every stream in a batch gets its token from the same engine step, so
    one slow step (one that admitted two prompts, say) is a slow gap in each of them at
    once. With `clusters` (an id per value: the step it came from, turns_of), the count
    above the p99 is a sum over steps, and its variance is the steps' (never taken below
    the binomial). The demo at four places (CI, 2026-12-06, the tracer's gaps): 13 of 344
    steps admitted two prompts, their 22 gaps of 242-266 ms (of 1,344) put the p99 at
    249 ms, and the independent interval, 242-254 ms, held none of the gaps of one
    prefill (171-226 ms), though half as many such steps would have put the p99 among
    them. The steps' variance was twice the binomial, the interval 175-257 ms; the
    replay (5-9 such steps in its five runs) said 175 ms.
    """
    ordered = sorted(values)
    n = len(ordered)
    variance = n * 0.99 * 0.01
    if clusters is not None and n:
        variance = max(variance, _clustered_variance(values, clusters, ordered[math.ceil(n * 0.99) - 1]))
    half = 1.96 * math.sqrt(variance)
    low = max(1, math.floor(n * 0.99 - half))
    high = min(n, math.ceil(n * 0.99 + half))
    return ordered[low - 1], ordered[high - 1]


def _clustered_variance(values: list[int], clusters: list[int], p99: int) -> float:
    """The variance of the count of values at or above the p99, as a sum of independent
    clusters: the number of clusters times the variance of one cluster's count."""
    above: dict[int, int] = {}
    for v, c in zip(values, clusters, strict=True):
        above[c] = above.get(c, 0) + (v >= p99)
    counts = list(above.values())
    mean = sum(counts) / len(counts)
    return len(counts) * sum((k - mean) ** 2 for k in counts) / len(counts)


def turns_of(end_ns: list[int], gap_ns: list[int]) -> list[int]:
    """A cluster id per gap: gaps that ended within half a median gap of the first of
    their cluster came from one engine step (the next step is a whole gap later; one
    step's tokens reach the clients within a millisecond or two)."""
    if not end_ns:
        return []
    window = (percentile(gap_ns, 50) or 0) / 2
    ids = [0] * len(end_ns)
    cluster, first = -1, None
    for i in sorted(range(len(end_ns)), key=end_ns.__getitem__):
        if first is None or end_ns[i] - first > window:
            cluster, first = cluster + 1, end_ns[i]
        ids[i] = cluster
    return ids


def _client(shape: LoadShape, c: int, port: int, path: str, keep_alive: bool, t_start: float,
            out: list[ClientResult]) -> None:
    time.sleep(max(0.0, t_start + c * shape.stagger_s - time.monotonic()))
    sock = None
    for i in range(shape.per_client):
        if sock is None:
            sock = connect("127.0.0.1", port, 300)
        res = request_once(sock, "127.0.0.1", path, shape.body(c, i), f"{c}-{i}", timeout=300)
        out.append(res)
        if not res.conn_reusable or not keep_alive:
            if res.conn_reusable:
                sock.close()
            sock = None
    if sock is not None:
        sock.close()


def closed_loop(shape: LoadShape, port: int, keep_alive: bool, path: str = "/v1/completions") -> Measured:
    """Every client sends its next request as soon as its last response ended: on the
    same connection (keep_alive), or on a new one (llama-server closes a connection
    after a stream without saying so)."""
    results: list[ClientResult] = []
    t_start = time.monotonic()
    threads = [threading.Thread(target=_client, args=(shape, c, port, path, keep_alive, t_start, results))
               for c in range(shape.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results if r.error is not None or r.aborted or r.status != 200]
    assert not bad and len(results) == shape.clients * shape.per_client, bad[:3]
    ttft, itl, itl_end = [], [], []
    for r in results:
        t = token_events(r)
        assert t, r
        ttft.append(t[0] - r.t_send_ns)
        itl.extend(b - a for a, b in zip(t, t[1:], strict=False))
        itl_end.extend(t[1:])
    return Measured(ttft, itl, len(results), itl_end)
