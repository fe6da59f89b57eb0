"""Calls the token service of tests/servers/grpc_token_server.py over one channel.

Runs --calls streaming calls at once (multiplexed on one HTTP/2 connection)
and --unary unary calls, and prints one JSON line per call with its own
CLOCK_MONOTONIC times: when the call began and when each message arrived.
A secret goes in the `authorization` metadata and in the request body, for
the privacy test.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import grpc


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--unary", type=int, default=2)
    parser.add_argument("--secret", default="")
    parser.add_argument("--traceparent", default="")
    parser.add_argument("--wait", action="store_true",
                        help="print ready, then wait for a line on stdin before connecting")
    args = parser.parse_args()
    if args.wait:
        print("ready", flush=True)
        sys.stdin.readline()
    channel = grpc.insecure_channel(f"127.0.0.1:{args.port}")
    grpc.channel_ready_future(channel).result(timeout=10)
    stream = channel.unary_stream("/llm.Generator/Stream")
    complete = channel.unary_unary("/llm.Generator/Complete")
    metadata = (("authorization", f"Bearer {args.secret}"),) if args.secret else ()
    if args.traceparent:  # the caller's W3C trace context, as an instrumented client sends it
        metadata += (("traceparent", args.traceparent), ("tracestate", "inferprobe=test,other=1"))
    out: list[dict] = []
    lock = threading.Lock()

    def streaming(i: int) -> None:
        ask = json.dumps({"tokens": args.tokens, "gap_ms": 15 + 5 * i, "secret": args.secret}).encode()
        start = time.monotonic_ns()
        received = [time.monotonic_ns() for _ in stream(ask, metadata=metadata, timeout=30)]
        with lock:
            out.append({"kind": "stream", "start_ns": start, "received_ns": received,
                        "end_ns": time.monotonic_ns()})

    threads = [threading.Thread(target=streaming, args=(i,)) for i in range(args.calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(args.unary):
        start = time.monotonic_ns()
        complete(json.dumps({"tokens": 1, "secret": args.secret}).encode(), metadata=metadata, timeout=30)
        out.append({"kind": "unary", "start_ns": start, "received_ns": [time.monotonic_ns()],
                    "end_ns": time.monotonic_ns()})
    channel.close()
    for call in out:
        print(json.dumps(call), flush=True)


if __name__ == "__main__":
    main()
