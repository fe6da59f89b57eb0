"""analyzers/llm_apis.py on the paths the SDKs send, whole and with their middle cut."""

from __future__ import annotations

import pytest

from inferprobe.analyzers.llm_apis import LlmApi, llm_api
from inferprobe.collector.model.events import path_ends, request_path


def kept(path: str) -> str:
    """The path as a recording keeps it (past 64 bytes, its two ends)."""
    raw, length = path_ends(path.encode())
    return request_path(raw, length)


BEDROCK_MODEL = "/model/anthropic.claude-3-5-sonnet-20241022-v2:0"
VERTEX = "/v1/projects/inference-team/locations/us-east5/publishers"


@pytest.mark.parametrize("path, api", [
    ("/v1/chat/completions", LlmApi("chat")),                     # OpenAI and every compatible server
    ("/openai/deployments/gpt-4o/chat/completions", LlmApi("chat")),
    ("/v1/completions", LlmApi("text_completion")),
    ("/api/generate", LlmApi("text_completion")),                 # Ollama
    ("/api/chat", LlmApi("chat")),
    ("/v1/embeddings", LlmApi("embeddings")),
    ("/v1/messages", LlmApi("chat", "anthropic")),
    (f"{BEDROCK_MODEL}/invoke-with-response-stream", LlmApi("chat", "aws.bedrock")),
    (f"{BEDROCK_MODEL}/converse-stream", LlmApi("chat", "aws.bedrock")),
    (f"{BEDROCK_MODEL}/invoke", LlmApi("chat", "aws.bedrock")),
    (f"{VERTEX}/anthropic/models/claude-sonnet-4@20250514:streamRawPredict", LlmApi("chat", "gcp.vertex_ai")),
    (f"{VERTEX}/google/models/gemini-2.5-flash:streamGenerateContent",
     LlmApi("generate_content", "gcp.vertex_ai")),
    ("/v1beta/models/gemini-2.5-flash:streamGenerateContent", LlmApi("generate_content", "gcp.gemini")),
    ("/v1/models/gemini-2.5-flash:generateContent", LlmApi("generate_content", "gcp.gemini")),
])
def test_each_api_is_named_whole_and_with_its_middle_cut(path, api):
    assert llm_api(path) == api
    assert llm_api(kept(path)) == api


@pytest.mark.parametrize("path", ["/health", "/metrics", "/", None, "/model/x/health", "/v1/models"])
def test_other_traffic_is_no_llm_api(path):
    assert llm_api(path) is None
