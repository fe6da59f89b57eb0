"""Streamed calls through the official openai or anthropic SDK, timed by the caller.

Usage: llm_sdk_client.py openai|anthropic BASE_URL CALLS TOKENS. The server is
one of tests/servers/stream_shapes* (they take the token count and pacing
from extra body fields) over HTTPS with a self-signed certificate, so
certificate checks are off. Prints one JSON line per call: the model, and
the CLOCK_MONOTONIC ns at which each token chunk reached the application.
The prompt carries a marker and the API key a secret that must never reach
the tracer's outputs.
"""

import json
import sys
import time

MARKER = "PRIVATE-MARKER-5e1d"
SECRET = "sk-SECRET-b7c2e9"


def openai_call(base_url: str, k: int, tokens: int) -> dict:
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=SECRET,
                           http_client=openai.DefaultHttpx2Client(verify=False))
    model = f"gpt-test-{k % 2}"
    received = []
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"{MARKER} say something {k}"}], stream=True,
        extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(time.monotonic_ns())
    return {"model": model, "path": "/v1/chat/completions", "received_ns": received}


def anthropic_call(base_url: str, k: int, tokens: int) -> dict:
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key=SECRET,
                                 http_client=anthropic.DefaultHttpxClient(verify=False))
    model = f"claude-test-{k % 2}"
    received = []
    with client.messages.stream(model=model, max_tokens=64,
                                messages=[{"role": "user", "content": f"{MARKER} say something {k}"}],
                                extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}",
                                            "interval_ms": 3}) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                received.append(time.monotonic_ns())
    return {"model": model, "path": "/v1/messages", "received_ns": received}


def main() -> None:
    sdk, base_url, calls, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    call = openai_call if sdk == "openai" else anthropic_call
    for k in range(calls):
        print(json.dumps(call(base_url, k, tokens)), flush=True)


if __name__ == "__main__":
    main()
