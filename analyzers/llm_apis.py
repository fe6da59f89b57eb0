"""Which LLM API a request speaks, from its path alone.

The OpenTelemetry GenAI conventions name an operation (gen_ai.operation.name:
chat, text_completion, embeddings, generate_content) and, where the API is
one provider's, the provider (gen_ai.provider.name). A path says both for the
clouds' APIs: Bedrock's /model/<model id>/invoke-with-response-stream,
Vertex's /v1/projects/<project>/locations/<region>/publishers/<publisher>/
models/<model>:streamRawPredict, Gemini's /v1beta/models/<model>:
streamGenerateContent, Anthropic's /v1/messages. An OpenAI-style path
(/v1/chat/completions) is spoken by OpenAI and by every compatible server
(vLLM, llama.cpp, Ollama, gateways), so it names the operation only.

Paths may come with their middle cut (a path past 64 bytes keeps its two
ends, collector/model/events.request_path): every rule here reads a path's
start and end only.

The host a request named (HTTP/1's Host header, its first 32 bytes) says the
rest where it is a cloud's endpoint: the provider of an OpenAI-style path
(api.openai.com), and the region of Bedrock's
(bedrock-runtime.<region>.amazonaws.com) and Vertex's
(<region>-aiplatform.googleapis.com).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LlmApi:
    operation: str             # gen_ai.operation.name
    provider: str | None = None  # gen_ai.provider.name, where the path or the host is one provider's
    region: str | None = None    # cloud.region, where the host names one


BEDROCK_OPERATIONS = ("/invoke", "/invoke-with-response-stream", "/converse", "/converse-stream")
GOOGLE_METHOD = re.compile(r":(stream)?(generateContent|rawPredict)$", re.IGNORECASE)
GEMINI_MODELS = re.compile(r"^/v1(alpha|beta)?/models/")
VERTEX_PROJECTS = re.compile(r"^/v1(beta1)?/projects/")


# A cloud endpoint's host (cut at 32 bytes, so matched from its start, by the
# names the clouds reserve for their endpoints): its provider, and the region
# it names (group 1, where the cut left it whole). AWS regions: us-east-1,
# ap-southeast-2, us-gov-west-1; Google's: us-central1, europe-west4.
CLOUD_HOSTS = (
    (re.compile(r"^bedrock-runtime(?:-fips)?\.(?:([a-z]{2}(?:-[a-z]+)+-\d+)(?:\.|$))?"), "aws.bedrock"),
    (re.compile(r"^([a-z]+(?:-[a-z]+)*\d+)-aiplatform\."), "gcp.vertex_ai"),
    (re.compile(r"^()aiplatform\.google"), "gcp.vertex_ai"),   # the global endpoint
    (re.compile(r"^()generativelanguage\.google"), "gcp.gemini"),
    (re.compile(r"^()api\.anthropic\.com$"), "anthropic"),
    (re.compile(r"^()api\.openai\.com$"), "openai"),
)


def cloud_endpoint(host: str | None) -> tuple[str | None, str | None]:
    """(provider, region) a request's host names, each None where it names none."""
    for pattern, provider in CLOUD_HOSTS:
        match = pattern.match((host or "").lower())
        if match:
            return provider, match.group(1) or None
    return None, None


def llm_api(path: str | None, host: str | None = None) -> LlmApi | None:
    """The API a request belongs to, or None for other HTTP traffic: the operation from
    its path, the provider from its path or else its host, the region from its host."""
    api = _by_path(path)
    if api is None or host is None:
        return api
    provider, region = cloud_endpoint(host)
    return LlmApi(api.operation, api.provider or provider, region)


def _by_path(path: str | None) -> LlmApi | None:
    p = path or ""
    if p.startswith("/model/") and p.endswith(BEDROCK_OPERATIONS):
        return LlmApi("chat", "aws.bedrock")
    google = GOOGLE_METHOD.search(p)
    if google is not None:
        operation = "generate_content" if google.group(2).lower() == "generatecontent" else "chat"
        if VERTEX_PROJECTS.match(p):
            return LlmApi(operation, "gcp.vertex_ai")
        if GEMINI_MODELS.match(p):
            return LlmApi(operation, "gcp.gemini")
    low = p.lower()
    if low.endswith("/v1/messages"):
        return LlmApi("chat", "anthropic")
    if "chat/completions" in low or low.endswith("/api/chat"):
        return LlmApi("chat")
    if low.endswith(("/completions", "/generate", "/generate_stream")):
        return LlmApi("text_completion")
    if low.endswith("/embeddings"):
        return LlmApi("embeddings")
    return None
