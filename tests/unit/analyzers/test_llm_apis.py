"""analyzers/llm_apis.py on the paths the SDKs send, whole and with their middle cut."""

from __future__ import annotations

import pytest

from inferprobe.analyzers.llm_apis import LlmApi, cloud_endpoint, llm_api
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


@pytest.mark.parametrize("host, provider, region", [
    ("bedrock-runtime.us-east-1.amazon", "aws.bedrock", "us-east-1"),         # cut at 32 bytes, as kept
    ("bedrock-runtime.ap-southeast-2.a", "aws.bedrock", "ap-southeast-2"),
    ("bedrock-runtime-fips.us-gov-west", "aws.bedrock", None),                # the region itself cut
    ("bedrock-runtime.us-gov-west-1.am", "aws.bedrock", "us-gov-west-1"),
    ("us-central1-aiplatform.googleapi", "gcp.vertex_ai", "us-central1"),
    ("europe-west4-aiplatform.googleap", "gcp.vertex_ai", "europe-west4"),
    ("aiplatform.googleapis.com", "gcp.vertex_ai", None),
    ("generativelanguage.googleapis.co", "gcp.gemini", None),
    ("api.openai.com", "openai", None),
    ("api.anthropic.com", "anthropic", None),
    ("127.0.0.1", None, None),
    ("llm-gateway.internal", None, None),
    (None, None, None),
])
def test_a_host_names_the_cloud_endpoint_and_its_region(host, provider, region):
    assert cloud_endpoint(host) == (provider, region)


def test_the_host_adds_the_provider_a_path_leaves_open_and_the_region():
    assert llm_api("/v1/chat/completions", "api.openai.com") == LlmApi("chat", "openai")
    assert llm_api("/model/m/converse-stream", "bedrock-runtime.eu-west-3.amazon") == \
        LlmApi("chat", "aws.bedrock", "eu-west-3")
    assert llm_api("/v1/messages", "gateway.internal") == LlmApi("chat", "anthropic")
    assert llm_api("/health", "api.openai.com") is None
