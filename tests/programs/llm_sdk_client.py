"""Streamed calls through the official openai, anthropic, google-genai or AWS SDKs, timed by the caller.

vertex is anthropic's AnthropicVertex (streamRawPredict, Anthropic's SSE, an
OAuth access token in Authorization); bedrock is anthropic's AnthropicBedrock
(invoke-with-response-stream, httpx),
boto3 is boto3's bedrock-runtime client (converse_stream, urllib3): both sign
their requests with SigV4 (an Authorization header, and x-amz-security-token
from the session token) with a secret that must never reach the tracer's outputs.

Usage: llm_sdk_client.py openai|anthropic|gemini|bedrock|boto3|vertex BASE_URL CALLS TOKENS [--wait]
[--timeout S]
[--retries N] [--resolve HOST] [--stall-first MS] [--fail-first STATUS] [--warm-up] [--unary]. The server is
one of tests/servers/stream_shapes* (they take the token count and pacing
from extra body fields) over HTTPS with a self-signed certificate, so
certificate checks are off. Prints one JSON line per call: the model, and
the CLOCK_MONOTONIC ns at which each token chunk reached the application,
and when the SDK call began and returned (its retries inside it). One
client object serves every call, made before the first: its connection
pool reuses connections as an application's does. With
--wait it first prints "ready" and waits for a line on stdin (a tracer
attaches meanwhile); --timeout and --retries go to the SDK client;
--stall-first MS asks the server to hold each call's first attempt, --fail-first
STATUS to answer it with that status (the SDK retries); --unary makes
non-streamed calls (one JSON answer).
The prompt carries a marker and the API key a secret that must never reach
the tracer's outputs.
"""

import json
import socket
import sys
import time

MARKER = "PRIVATE-MARKER-5e1d"
STALL: dict = {}  # --stall-first MS / --fail-first STATUS: what the server does to each call's first attempt
SECRET = "sk-SECRET-b7c2e9"


def openai_client(base_url: str, options: dict):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=SECRET,
                         http_client=openai.DefaultHttpx2Client(verify=False), **options)


def anthropic_client(base_url: str, options: dict):
    import anthropic

    return anthropic.Anthropic(base_url=base_url, api_key=SECRET,
                               http_client=anthropic.DefaultHttpxClient(verify=False), **options)


# An AWS key pair and session token for the SigV4 signatures; the server does not check them.
AWS_KEY_ID, AWS_SESSION_TOKEN = "AKIDEXAMPLE", "SESSION-TOKEN-" + SECRET


def bedrock_client(base_url: str, options: dict):
    import anthropic

    return anthropic.AnthropicBedrock(base_url=base_url, aws_region="us-east-1", aws_access_key=AWS_KEY_ID,
                                      aws_secret_key=SECRET, aws_session_token=AWS_SESSION_TOKEN,
                                      http_client=anthropic.DefaultHttpxClient(verify=False), **options)


def bedrock_call(client, k: int, tokens: int) -> dict:
    model = f"anthropic.claude-test-{k % 2}"
    return messages_stream_call(client, k, tokens, model, f"/model/{model}/invoke-with-response-stream",
                                body_model=False)


def boto3_client(base_url: str, options: dict):
    import boto3
    from botocore.config import Config

    retries = {"max_attempts": options.get("max_retries", 2) + 1, "mode": "standard"}
    return boto3.client("bedrock-runtime", endpoint_url=base_url, region_name="us-east-1", verify=False,
                        aws_access_key_id=AWS_KEY_ID, aws_secret_access_key=SECRET,
                        aws_session_token=AWS_SESSION_TOKEN, config=Config(retries=retries))


def boto3_call(client, k: int, tokens: int) -> dict:
    model = f"anthropic.claude-test-{k % 2}"
    received = []
    began = time.monotonic_ns()
    answer = client.converse_stream(
        modelId=model, messages=[{"role": "user", "content": [{"text": f"{MARKER} say something {k}"}]}],
        additionalModelRequestFields={"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3, **STALL})
    for event in answer["stream"]:
        if "contentBlockDelta" in event:
            received.append(time.monotonic_ns())
    return {"model": None, "path": f"/model/{model}/converse-stream", "received_ns": received,
            "began_ns": began, "returned_ns": time.monotonic_ns()}


def vertex_client(base_url: str, options: dict):
    import anthropic

    # an OAuth access token, as google-auth would hand it over: a secret like the API keys
    return anthropic.AnthropicVertex(base_url=f"{base_url}/v1", region="us-east5",
                                     project_id="inferprobe-test", access_token=SECRET,
                                     http_client=anthropic.DefaultHttpxClient(verify=False), **options)


def vertex_call(client, k: int, tokens: int) -> dict:
    """Claude through Vertex AI: Anthropic's Messages API and SSE, the model in the path."""
    model = f"claude-test-{k % 2}"
    path = (f"/v1/projects/inferprobe-test/locations/us-east5/publishers/anthropic/models/{model}"
            ":streamRawPredict")
    return messages_stream_call(client, k, tokens, model, path, body_model=False)


def gemini_client(base_url: str, options: dict):
    from google import genai
    from google.genai import types

    # the test's own certificate; the key goes in x-goog-api-key
    return genai.Client(api_key=SECRET, http_options=types.HttpOptions(
        base_url=base_url, api_version="v1beta", client_args={"verify": False}, **options))


def gemini_call(client, k: int, tokens: int) -> dict:
    from google.genai import types

    model = f"gemini-test-{k % 2}"
    received = []
    began = time.monotonic_ns()
    extra = {"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3, **STALL}
    for chunk in client.models.generate_content_stream(
            model=model, contents=f"{MARKER} say something {k}",
            config=types.GenerateContentConfig(http_options=types.HttpOptions(extra_body=extra))):
        if chunk.text:
            received.append(time.monotonic_ns())
    return {"model": None, "path": f"/v1beta/models/{model}:streamGenerateContent", "received_ns": received,
            "began_ns": began, "returned_ns": time.monotonic_ns()}


def openai_unary_call(client, k: int, tokens: int) -> dict:
    model = f"gpt-test-{k % 2}"
    began = time.monotonic_ns()
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"{MARKER} say something {k}"}], stream=False,
        extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3})
    assert answer.choices[0].message.content
    return {"model": model, "path": "/v1/chat/completions", "received_ns": [], "began_ns": began,
            "returned_ns": time.monotonic_ns()}


def anthropic_unary_call(client, k: int, tokens: int) -> dict:
    model = f"claude-test-{k % 2}"
    began = time.monotonic_ns()
    answer = client.messages.create(
        model=model, max_tokens=64, stream=False, messages=[{"role": "user", "content": f"{MARKER} say {k}"}],
        extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3})
    assert answer.content[0].text
    return {"model": model, "path": "/v1/messages", "received_ns": [], "began_ns": began,
            "returned_ns": time.monotonic_ns()}


def openai_call(client, k: int, tokens: int) -> dict:
    model = f"gpt-test-{k % 2}"
    received = []
    began = time.monotonic_ns()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": f"{MARKER} say something {k}"}], stream=True,
        extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}", "interval_ms": 3, **STALL})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(time.monotonic_ns())
    return {"model": model, "path": "/v1/chat/completions", "received_ns": received, "began_ns": began,
            "returned_ns": time.monotonic_ns()}


def messages_stream_call(client, k: int, tokens: int, model: str, path: str, body_model: bool = True) -> dict:
    """One streamed Messages API call through an anthropic client (direct, Bedrock or
    Vertex: the clouds' clients move the model from the body into the path)."""
    received = []
    began = time.monotonic_ns()
    with client.messages.stream(model=model, max_tokens=64,
                                messages=[{"role": "user", "content": f"{MARKER} say something {k}"}],
                                extra_body={"tokens": tokens, "prompt": f"{MARKER} {k}",
                                            "interval_ms": 3, **STALL}) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                received.append(time.monotonic_ns())
    return {"model": model if body_model else None, "path": path, "received_ns": received, "began_ns": began,
            "returned_ns": time.monotonic_ns()}


def anthropic_call(client, k: int, tokens: int) -> dict:
    return messages_stream_call(client, k, tokens, f"claude-test-{k % 2}", "/v1/messages")


def resolve_to_loopback(host: str) -> None:
    """--resolve HOST: HOST's address is 127.0.0.1 in this process (curl's --resolve), so
    that a base URL can name a cloud's endpoint (its Host header, SNI and SigV4 host)
    and reach the test's server."""
    real = socket.getaddrinfo

    def getaddrinfo(name, *args, **kwargs):
        return real("127.0.0.1" if name == host else name, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


def main() -> None:
    sdk, base_url, calls, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rest = sys.argv[5:]
    options = {}
    if "--resolve" in rest:
        resolve_to_loopback(rest[rest.index("--resolve") + 1])
    if "--timeout" in rest:
        options["timeout"] = float(rest[rest.index("--timeout") + 1])
    if "--retries" in rest:
        options["max_retries"] = int(rest[rest.index("--retries") + 1])
    make_client = {"openai": openai_client, "anthropic": anthropic_client, "gemini": gemini_client,
                   "bedrock": bedrock_client, "boto3": boto3_client, "vertex": vertex_client}[sdk]
    call = {"openai": openai_call, "anthropic": anthropic_call, "gemini": gemini_call,
            "bedrock": bedrock_call, "boto3": boto3_call, "vertex": vertex_call}[sdk]
    if "--unary" in rest:
        call = openai_unary_call if sdk == "openai" else anthropic_unary_call
    # A first call in a fresh process spends ~30 ms in the SDK (its models, its
    # transport) before any syscall, time nothing outside the process can see:
    # --warm-up makes one call on a client of its own before the measured calls.
    if "--warm-up" in rest:
        call(make_client(base_url, {}), -1, 1)
    if "--stall-first" in rest:
        STALL["stall_first_ms"] = float(rest[rest.index("--stall-first") + 1])
    if "--fail-first" in rest:
        STALL["fail_first_status"] = int(rest[rest.index("--fail-first") + 1])
    # One client for all calls, as applications keep theirs: its pool reuses connections.
    client = make_client(base_url, options)
    if "--wait" in rest:
        print("ready", flush=True)
        sys.stdin.readline()
    for k in range(calls):
        print(json.dumps(call(client, k, tokens)), flush=True)


if __name__ == "__main__":
    main()
