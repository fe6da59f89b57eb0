"""The OpenAI wire format the demo server speaks: request validation and response bodies.

Pure functions (no aiohttp, no torch) so the rules are testable on their own.
Supported: /v1/completions (prompt: a string, a list of one string, or a list
of token ids) and /v1/chat/completions (messages with role and string
content), stream true/false, stream_options.include_usage, max_tokens,
temperature (0 = greedy, the default here so runs are reproducible), seed.
Other OpenAI fields are accepted and ignored, except n != 1 (one choice only).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
ROLES = ("system", "user", "assistant")


class BadRequest(Exception):
    """A client error: answered with 400 and an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": "invalid_request_error",
                          "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    max_tokens: int  # largest max_tokens a request may ask for
    context_length: int  # the model's: prompt + max_tokens must fit
    kv_capacity: int  # the engine's: a request that cannot fit would wait forever


@dataclass(frozen=True)
class Parsed:
    chat: bool
    prompt_ids: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    temperature: float
    seed: int | None


def parse(raw: bytes, *, chat: bool, limits: Limits, encode: Callable[[Any], list[int]]) -> Parsed:
    """Validate a request body; ``encode`` tokenizes a prompt string or a message list."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    prompt_ids = encode(_messages(body)) if chat else _prompt_ids(body, encode)
    if not prompt_ids:
        raise BadRequest("the prompt is empty", param="messages" if chat else "prompt")

    default = limits.max_tokens if chat else min(COMPLETION_DEFAULT_MAX_TOKENS, limits.max_tokens)
    max_tokens = body.get("max_completion_tokens" if chat and "max_completion_tokens" in body
                          else "max_tokens", default)
    if max_tokens is None:
        max_tokens = default
    if not _is_int(max_tokens) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer", param="max_tokens")
    if max_tokens > limits.max_tokens:
        raise BadRequest(f"max_tokens is {max_tokens}, above this server's limit of {limits.max_tokens}",
                         param="max_tokens")
    total = len(prompt_ids) + max_tokens
    if total > limits.context_length:
        raise BadRequest(
            f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the model's "
            f"context length of {limits.context_length} tokens",
            param="messages" if chat else "prompt", code="context_length_exceeded")
    if total > limits.kv_capacity:
        raise BadRequest(
            f"the prompt ({len(prompt_ids)} tokens) plus max_tokens ({max_tokens}) exceeds this server's "
            f"KV cache capacity of {limits.kv_capacity} tokens",
            param="max_tokens", code="context_length_exceeded")

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object", param="stream_options")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("only n=1 is supported", param="n")
    temperature = body.get("temperature", 0.0)
    if temperature is None:
        temperature = 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise BadRequest("temperature must be a number from 0 to 2", param="temperature")
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest("seed must be an integer", param="seed")
    return Parsed(chat=chat, prompt_ids=prompt_ids, max_tokens=max_tokens, stream=stream,
                  include_usage=bool(options.get("include_usage")), temperature=float(temperature),
                  seed=seed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _prompt_ids(body: dict, encode: Callable[[Any], list[int]]) -> list[int]:
    if "prompt" not in body:
        raise BadRequest("missing required field: prompt", param="prompt", code="missing_field")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return list(prompt)
    raise BadRequest("prompt must be a string, a list of one string, or a list of token ids",
                     param="prompt")


def _messages(body: dict) -> list[dict]:
    if "messages" not in body:
        raise BadRequest("missing required field: messages", param="messages", code="missing_field")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}] must have a role ({', '.join(ROLES)}) and string content",
                             param=f"messages[{i}]")
        out.append({"role": m["role"], "content": m["content"]})
    return out


# ---------------------------------------------------------------- responses


@dataclass(frozen=True)
class Meta:
    """What every response object of one request repeats."""

    chat: bool
    req_id: int
    model: str
    created: int

    @classmethod
    def new(cls, chat: bool, req_id: int, model: str) -> Meta:
        return cls(chat, req_id, model, int(time.time()))

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.req_id}"

    def _head(self, chunk: bool) -> dict:
        if self.chat:
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chunk(meta: Meta, text: str, finish_reason: str | None, first: bool = False) -> dict:
    """One streamed event: a token's text, or (finish_reason set) the end.

    The end event carries only text a last token left held back (see
    Detokenizer), usually none.
    """
    if meta.chat:
        delta: dict = {"role": "assistant"} if first else {}
        if finish_reason is None or text:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**meta._head(chunk=True), "choices": [choice]}


def usage_chunk(meta: Meta, prompt_tokens: int, completion_tokens: int) -> dict:
    return {**meta._head(chunk=True), "choices": [], "usage": usage(prompt_tokens, completion_tokens)}


def full(meta: Meta, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
    if meta.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**meta._head(chunk=False), "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}


def error_body(message: str, kind: str = "server_error", code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Detokenizer:
    """Incremental text for a growing token list.

    Decodes the whole output each time and hands out the new suffix: a token
    may end inside a multi-byte character (decoded as U+FFFD) or change how
    the previous one renders, so that suffix is held back until it settles.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._text = ""

    def add(self, token: int) -> str:
        self._ids.append(token)
        text = self._decode(self._ids)
        if text.endswith("\ufffd") or not text.startswith(self._text):
            return ""
        delta, self._text = text[len(self._text):], text
        return delta

    def flush(self) -> str:
        text = self._decode(self._ids)
        delta = text[len(self._text):] if text.startswith(self._text) else ""
        self._text = text
        return delta

    @property
    def text(self) -> str:
        return self._decode(self._ids)
