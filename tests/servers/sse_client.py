#!/usr/bin/env python3
"""The raw-socket load client for the test SSE server (sse_server.py).

The client itself lives in the package (inferprobe.demo.sse_client), shared
with the demo load generator; this module re-exports it for the tracer tests
and keeps the command line the tests and benchmarks/bench_overhead.py run::

    python tests/servers/sse_client.py --port P --connections 32 --duration 10 \\
        --max-tokens 16 --interval-ms 5

prints a JSON summary (throughput, client-side TTFT, ITL and E2E percentiles).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from inferprobe.analyzers.cadence import percentile
from inferprobe.demo.loadgen import summarize
from inferprobe.demo.sse_client import (
    ClientResult,
    ProtocolError,
    ResponseParser,
    connect,
    request_once,
    run_load,
)

__all__ = ["ClientResult", "ProtocolError", "ResponseParser", "connect", "percentile", "request_once",
           "run_load", "summarize"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="SSE load client for sse_server.py")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--duration", type=float, default=None, help="seconds")
    ap.add_argument("--requests", type=int, default=None, help="per connection")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--prompt", default="the quick brown fox jumps over the lazy dog")
    ap.add_argument("--path", default="/v1/completions")
    ap.add_argument("--no-stream", action="store_true")
    args = ap.parse_args(argv)
    if args.duration is None and args.requests is None:
        args.duration = 10.0

    def body_factory(c: int, i: int) -> dict:
        body: dict = {
            "max_tokens": args.max_tokens,
            "interval_ms": args.interval_ms,
            "stream": not args.no_stream,
        }
        if "chat" in args.path:
            body["messages"] = [{"role": "user", "content": args.prompt}]
        else:
            body["prompt"] = args.prompt
        return body

    t0 = time.monotonic()
    results = run_load(
        args.host,
        args.port,
        connections=args.connections,
        requests_per_connection=args.requests,
        duration_s=args.duration,
        body_factory=body_factory,
        path=args.path,
    )
    wall = time.monotonic() - t0
    json.dump(summarize(results, wall), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
