"""Streams LLM responses over HTTP/2 on TLS with httpx (its HTTP/2 support,
the h2 library), one call after another on one connection, and prints one
JSON line per call with its own CLOCK_MONOTONIC times: when the call began,
when each token event arrived (SSE "data:" lines other than [DONE] whose
choices hold a delta with content; NDJSON lines not "done"), when it ended.

Usage: h2_stream_client.py PORT CALLS TOKENS PATH...
Prints READY and waits for a line on stdin before the first call.
"""

from __future__ import annotations

import json
import sys
import time

try:
    import httpx2 as httpx  # the openai and anthropic SDKs' HTTP client, as installed here
except ImportError:
    import httpx


def is_token(line: str) -> bool:
    """An OpenAI SSE event with content, or an Ollama NDJSON line before the last."""
    if line.startswith("data:"):
        payload = line[5:].strip()
        if payload == "[DONE]":
            return False
        choices = json.loads(payload).get("choices") or []
        return any((c.get("delta") or {}).get("content") for c in choices)
    return line.startswith("{") and not json.loads(line).get("done")


def main() -> None:
    port, calls, tokens, paths = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    # The server's certificate is the test's own, made for this run.
    with httpx.Client(http2=True, verify=False, timeout=30) as client:
        print("READY", flush=True)
        sys.stdin.readline()
        for path in paths:
            for k in range(calls):
                body = {"model": f"h2-model-{k}", "tokens": tokens, "prompt": "PRIVATE h2 prompt",
                        "interval_ms": 3, "stream": True}
                began = time.monotonic_ns()
                received = []
                with client.stream("POST", f"https://127.0.0.1:{port}{path}", json=body) as answer:
                    assert answer.http_version == "HTTP/2", answer.http_version
                    for line in answer.iter_lines():
                        if is_token(line):
                            received.append(time.monotonic_ns())
                print(json.dumps({"path": path, "start_ns": began, "received_ns": received,
                                  "end_ns": time.monotonic_ns()}), flush=True)


if __name__ == "__main__":
    main()
