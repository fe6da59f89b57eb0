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
start and end only. The host, which would tell api.openai.com or a region
apart, is not read (docs/client-calls.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LlmApi:
    operation: str             # gen_ai.operation.name
    provider: str | None = None  # gen_ai.provider.name, where the path is one provider's


BEDROCK_OPERATIONS = ("/invoke", "/invoke-with-response-stream", "/converse", "/converse-stream")
GOOGLE_METHOD = re.compile(r":(stream)?(generateContent|rawPredict)$", re.IGNORECASE)
GEMINI_MODELS = re.compile(r"^/v1(alpha|beta)?/models/")
VERTEX_PROJECTS = re.compile(r"^/v1(beta1)?/projects/")


def llm_api(path: str | None) -> LlmApi | None:
    """The API a request path belongs to, or None for other HTTP traffic."""
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
