"""The in-kernel HTTP classifier (bpf/sock.bpf.c) against crafted bytes.

A scripted server answers each request with exact writes, one send() each,
over a real TCP connection; the tracer's io_events for those reads and
writes are compared field by field with what each buffer holds. The cases
are the ones servers differ in: header case, Content-Type parameters, bare
"\\n" line ends, SSE fields with and without a space, comments, several
events per write, [DONE] and the last chunk coalesced, headers past the
512-byte scan window, a write longer than the window whose end is only in
its tail, many events coalesced into one long write (with lines cut by
every window edge, and past the last window), vectored writes whose end lies
past the iovecs copied, and a length-framed body that is not scanned at all.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

import pytest

from inferprobe.collector.model.events import HttpFlag, HttpKind, IoRecord

from tests.support.kernel import KernelCapture, bytes_moved, needs_root, scripted_exchange
from tests.support.processes import LISTENING_SERVER
from tests.support.sse_scan import SSE_WINDOW, SSE_WINDOW_STEP, sse_events_counted

pytestmark = [pytest.mark.bpf, needs_root]

FLAGS = (HttpFlag.HEADERS_END | HttpFlag.CHUNKED | HttpFlag.EVENT_STREAM | HttpFlag.SSE_DONE
         | HttpFlag.CHUNKED_END | HttpFlag.CONN_CLOSE | HttpFlag.HAS_LENGTH | HttpFlag.NDJSON_STREAM
         | HttpFlag.LAST_CHUNK | HttpFlag.BLANK_LINE_END | HttpFlag.JSON_DONE)


@dataclass
class Expect:
    data: bytes | list[bytes]   # a list: one vectored write, a buffer per iovec
    kind: HttpKind = HttpKind.DATA
    flags: HttpFlag = HttpFlag(0)
    status: int = 0
    method: str | None = None
    path: str | None = None
    content_length: int | None = None
    header_bytes: int = 0
    sse_events: int = 0
    json_lines: int | None = None  # None: not compared (an SSE body; nothing reads it there)
    named_events: int = 0
    event_name: str | None = None
    output_tokens: int | None = None
    input_tokens: int | None = None
    model: str | None = None

    @property
    def payload(self) -> bytes:
        return b"".join(self.data) if isinstance(self.data, list) else self.data


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n" % len(payload) + payload + b"\r\n"


H = HttpFlag
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
REQ_A = (b"POST /v1/chat/completions?key=secret HTTP/1.1\r\nHost: h\r\nCONTENT-LENGTH:  17\r\n"
         b"Content-Type: application/json\r\n\r\n")
REQ_BIG = b"GET /big HTTP/1.1\r\nX-Pad: " + b"a" * 700 + b"\r\nContent-Length: 3\r\n\r\nabc"
BIG_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: CHUNKED\r\ncontent-type:text/event-stream\r\n\r\n"
LONG_WRITE = chunk(b"data: " + b"x" * 1500 + b"\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
BARE_LF = b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok"
REQ_HEALTH = b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n"
NOT_FOUND = b"HTTP/1.0 404 Not Found\r\ncontent-length: 9\r\nConnection: close\r\n\r\n"
REQ_PATCH = b"PATCH /p HTTP/1.1\r\nHost: x\r\n\r\n"
NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"
REQ_PLAIN = b"GET /plain HTTP/1.1\r\nHost: h\r\n\r\n"
# Length-framed, not an event stream: its body is not scanned, so SSE-looking
# lines in it are not counted (the kernel skips the scan; nothing reads it).
PLAIN_BODY = b"data: not a token\n\ndata: [DONE]\n\n"
REQ_VEC = b"GET /vec HTTP/1.1\r\nHost: h\r\n\r\n"
# Paths past PATH_MAX_BYTES (64) keep their two ends, 32 bytes each: Bedrock's
# names its operation last. One of exactly 64 is whole; one whose end is past
# PATH_SCAN_BYTES (255) keeps its first 64.
BEDROCK = "/model/anthropic.claude-3-5-sonnet-20241022-v2:0/invoke-with-response-stream"
PATH_64, PATH_300 = "/" + "a" * 63, "/" + "b" * 299
C1, C2 = chunk(b"data: a\n\n"), chunk(b"data: [DONE]\n\n")
# More iovecs than the kernel copies (16, or 8 in sock_hash.bpf.o: MAX_IOVECS),
# empty ones among them, the last chunk alone in the last: the end is found by
# walking the rest.
VEC_MANY = [C1[:3], C1[3:6], C1[6:9], C1[9:12], C1[12:], *[b""] * 11, C2, b"0\r\n\r\n"]
# The first iovec fills the 512-byte head: the end is in the second.
VEC_FULL = [chunk(b"data: " + b"x" * 600 + b"\n\n"), C2 + b"0\r\n\r\n"]


def node_chunk(payload: bytes) -> list[bytes]:
    """A chunk as Node's http module hands it to writev: size line, CRLF, data, CRLF."""
    return [b"%x" % len(payload), b"\r\n", payload, b"\r\n"]


def node_response(*events: bytes) -> list[bytes]:
    """Node's headers and the events written in the same tick: one writev, the
    first chunk's size line in the headers' iovec."""
    parts = [part for event in events for part in node_chunk(event)]
    return [SSE_HEAD + parts[0], *parts[1:]]


def hyper_chunk(payload: bytes) -> list[bytes]:
    """A chunk as hyper (Rust) hands it to writev: size line, data, CRLF."""
    return [b"%x\r\n" % len(payload), payload, b"\r\n"]


CLOSE_SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
FRAMING_LOOKALIKE = [b"da", b"ta", b': {"choices":[{"delta":{"content":"x"}}]}', b"\n\n"]
assert len(FRAMING_LOOKALIKE[0]) == len(b"%x" % len(FRAMING_LOOKALIKE[2]))
# On a chunked response: a 2-byte buffer before a payload of 64 KiB or more (five hex
# digits) and a 2-byte one after is no size line of no digits: it is read.
HUGE_PAYLOAD_SPLIT = [b"da", b"ta: " + b"x" * 0x10000 + b"\n", b"\n\n"]

# Two token chunks that hyper queued and wrote at once, and the same with the
# end of the stream: every "data:" line and [DONE] is in the copied head.
HYPER_TWO = hyper_chunk(b'data: {"t":1}\n\n') + hyper_chunk(b'data: {"t":2}\n\n')
HYPER_END = hyper_chunk(b'data: {"t":3}\n\n') + hyper_chunk(b"data: [DONE]\n\n") + [b"0\r\n\r\n"]
def get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % path.encode()


PLAIN_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(PLAIN_BODY)



def line_at(offset: int, line: bytes, pad_after: int = 0) -> bytes:
    """One chunk: a token event padded so that `line` starts `offset` bytes into
    the write, then an SSE comment of pad_after bytes (not an event)."""
    for m in range(offset):
        comment = b": " + b"z" * pad_after + b"\n\n" if pad_after else b""
        payload = b"data: " + b"x" * m + b"\n\n" + line + comment
        write = chunk(payload)
        if write.index(line, 8 + m) == offset:
            return write
    raise ValueError(offset)


def openai_payload(i: int) -> bytes:
    """A chat-completion chunk's SSE event, the size OpenAI-compatible servers send (~300 bytes)."""
    body = {"id": "chatcmpl-" + "a" * 24, "object": "chat.completion.chunk", "created": 1700000000 + i,
            "model": "SmolLM2-135M-Instruct", "system_fingerprint": "fp_" + "b" * 10,
            "choices": [{"index": 0, "delta": {"content": f" tok{i}"}, "logprobs": None,
                         "finish_reason": None}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def openai_event(i: int) -> bytes:
    return chunk(openai_payload(i))


# Several events a server queued while the client read slowly and wrote at once.
COALESCED = b"".join(openai_event(i) for i in range(30)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
PAST_LAST_WINDOW = b"".join(openai_event(i) for i in range(60)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def split(data: bytes, size: int) -> list[bytes]:
    """One vectored write of `data`, an iovec per `size` bytes."""
    return [data[i:i + size] for i in range(0, len(data), size)]


# The same events queued and written with one sendmsg(), as Python 3.12+ asyncio
# transports do when the client reads slowly (an iovec per queued write) and
# hyper does (three per chunk); cut into 100-byte iovecs, windows end and
# resume inside them.
ASYNCIO_QUEUED = [openai_event(i) for i in range(20)] + [chunk(b"data: [DONE]\n\n"), b"0\r\n\r\n"]
HYPER_QUEUED = [part for i in range(12) for part in hyper_chunk(openai_payload(i))] + HYPER_END
# "data:" lines starting across each edge of the first and second windows.
EDGES = [*range(SSE_WINDOW - 16, SSE_WINDOW + 4),
         *range(SSE_WINDOW + SSE_WINDOW_STEP - 16, SSE_WINDOW + SSE_WINDOW_STEP + 4)]

# (the request the client sends, what the server's read of it must give,
#  the server's writes and what each must give)
STEPS: list[tuple[Expect, list[Expect]]] = [
    (Expect(REQ_A + b'{"prompt":"hi!!"}', HttpKind.REQUEST, H.HEADERS_END | H.HAS_LENGTH,
            method="POST", path="/v1/chat/completions", content_length=17, header_bytes=len(REQ_A)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(chunk(b'data: {"t":1}\n\ndata: {"t":2}\n\n'), sse_events=2),
      Expect(chunk(b'data:{"t":3}\r\n\r\n'), sse_events=1),
      # a named event that is not a *delta: a stream event, not a token
      Expect(chunk(b"event: x\ndata: a\nid: 1\n\n"), named_events=1, event_name="x"),
      Expect(chunk(b"xdata: no\n: data: a comment\nDATA: not a data field\n\n")),
      Expect(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n", flags=H.SSE_DONE | H.CHUNKED_END)]),
    (Expect(REQ_HEALTH, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/health",
            header_bytes=len(REQ_HEALTH)),
     [Expect(NOT_FOUND + b"not found", HttpKind.RESPONSE, H.HEADERS_END | H.HAS_LENGTH | H.CONN_CLOSE,
             status=404, content_length=9, header_bytes=len(NOT_FOUND))]),
    (Expect(REQ_BIG, HttpKind.REQUEST, method="GET", path="/big"),  # headers end past the window
     [Expect(BIG_HEAD + chunk(b"data: a\n\n"), HttpKind.RESPONSE,
             H.HEADERS_END | H.CHUNKED | H.EVENT_STREAM, status=200, header_bytes=len(BIG_HEAD),
             sse_events=1),
      # longer than the window: one "data:" in view, [DONE] and the last chunk only in the tail
      Expect(LONG_WRITE, sse_events=1, flags=H.SSE_DONE | H.CHUNKED_END)]),
    (Expect(REQ_PATCH, HttpKind.REQUEST, H.HEADERS_END, method="PATCH", path="/p",
            header_bytes=len(REQ_PATCH)),
     [Expect(BARE_LF, HttpKind.RESPONSE, H.HEADERS_END | H.HAS_LENGTH, status=200, content_length=2,
             header_bytes=len(BARE_LF) - 2),
      Expect(b"0\r\n\r\n", flags=H.CHUNKED_END),
      Expect(NO_CONTENT, HttpKind.RESPONSE, H.HEADERS_END, status=204, header_bytes=len(NO_CONTENT))]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec",
            header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(VEC_MANY, sse_events=1, flags=H.CHUNKED_END)]),  # [DONE]: in neither head nor tail
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec",
            header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(VEC_FULL, sse_events=1, flags=H.SSE_DONE | H.CHUNKED_END)]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec",
            header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(HYPER_TWO, sse_events=2),
      Expect(HYPER_END, sse_events=1, flags=H.SSE_DONE | H.CHUNKED_END)]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec",
            header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      *[Expect(line_at(at, b'data: {"t":2}\n\n', pad_after=600), sse_events=2) for at in EDGES],
      *[Expect(line_at(at, b"data: [DONE]\n\n") + b"0\r\n\r\n", sse_events=1,
               flags=H.SSE_DONE | H.CHUNKED_END) for at in EDGES[::3]],
      Expect(COALESCED, sse_events=30, flags=H.SSE_DONE | H.CHUNKED_END),
      # [DONE] and the last chunk are then seen in the write's tail
      Expect(PAST_LAST_WINDOW, sse_events=sse_events_counted(PAST_LAST_WINDOW, vectored=False),
             flags=H.SSE_DONE | H.CHUNKED_END),
      Expect(ASYNCIO_QUEUED, sse_events=20, flags=H.SSE_DONE | H.CHUNKED_END),
      Expect(HYPER_QUEUED, sse_events=13, flags=H.SSE_DONE | H.CHUNKED_END),
      Expect(split(COALESCED[:6000], 100), sse_events=sse_events_counted(COALESCED[:6000], vectored=True)),
      Expect(split(PAST_LAST_WINDOW, 300), sse_events=sse_events_counted(PAST_LAST_WINDOW, vectored=True),
             flags=H.SSE_DONE | H.CHUNKED_END)]),
    (Expect(REQ_PLAIN, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/plain",
            header_bytes=len(REQ_PLAIN)),
     [Expect(PLAIN_HEAD + PLAIN_BODY, HttpKind.RESPONSE, H.HEADERS_END | H.HAS_LENGTH, status=200,
             content_length=len(PLAIN_BODY), header_bytes=len(PLAIN_HEAD))]),
    *[(Expect(get(path + "?key=secret"), HttpKind.REQUEST, H.HEADERS_END, method="GET", path=kept,
              header_bytes=len(get(path + "?key=secret"))),
       [Expect(PLAIN_HEAD + PLAIN_BODY, HttpKind.RESPONSE, H.HEADERS_END | H.HAS_LENGTH, status=200,
               content_length=len(PLAIN_BODY), header_bytes=len(PLAIN_HEAD))])
      for path, kept in ((BEDROCK, BEDROCK[:32] + "…" + BEDROCK[-32:]), (PATH_64, PATH_64),
                         (PATH_300, PATH_300[:64]))],
]


STREAM_FIELDS = ("json_lines", "named_events", "event_name", "output_tokens", "input_tokens", "model")


NDJSON_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n")
JSONL_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/jsonl; charset=utf-8\r\nConnection: close\r\n\r\n"
MODEL_BODY = b'{"prompt": "hi \\"model\\": \\"no\\"", "model": "llama3.2:1b", "x":1}'
REQ_MODEL = (b"POST /api/generate HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(MODEL_BODY)
             + MODEL_BODY)
# The OpenAI SDKs write "model" after "messages": a long prompt pushes it to the read's end.
LONG_BODY = json.dumps({"messages": [{"role": "user", "content": "y" * 900}],
                        "model": "gpt-4o-mini", "stream": True}).encode()
REQ_MODEL_LATE = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n"
                  % len(LONG_BODY))
OLLAMA_LINE = b'{"model":"llama3.2:1b","created_at":"2024-01-01T00:00:00Z","response":" hi","done":false}\n'
OLLAMA_DONE = (b'{"model":"llama3.2:1b","created_at":"2024-01-01T00:00:00Z","response":"","done":true,'
               b'"done_reason":"stop","context":[' + b",".join(b"%d" % i for i in range(400)) +
               b'],"total_duration":123,"prompt_eval_count":26,"prompt_eval_duration":5,'
               b'"eval_count":290,"eval_duration":4709213000}\n')
ANTHROPIC_START = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
                   b'"usage":{"input_tokens":25,"cache_creation_input_tokens":0,"output_tokens":1}}}\n\n')
ANTHROPIC_DELTA = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                   b'"delta":{"type":"text_delta","text":"Hi"}}\n\n')
ANTHROPIC_END = (b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
                 b'"usage":{"output_tokens":15}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
OPENAI_USAGE = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,'
                b'"total_tokens":21,"completion_tokens_details":{"reasoning_tokens":0}}}\n\ndata: [DONE]\n\n')
# Gemini (streamGenerateContent?alt=sse): usageMetadata in every chunk; the output count is read
GEMINI_CHUNK = (b'data: {"candidates": [{"content": {"parts": [{"text": "Hi"}],"role": "model"},"index": 0}],'
                b'"usageMetadata": {"promptTokenCount": 9,"totalTokenCount": 9},"modelVersion": "g"}\r\n\r\n')
GEMINI_LAST = (b'data: {"candidates": [{"content": {"parts": [{"text": " there"}],"role": "model"},'
               b'"finishReason": "STOP","index": 0}],"usageMetadata": {"promptTokenCount": 9,'
               b'"candidatesTokenCount": 14,"totalTokenCount": 28,"thoughtsTokenCount": 5,'
               b'"cachedContentTokenCount": 3},"modelVersion": "g"}\r\n\r\n')
LLAMA_FINAL = (b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"timings":'
               b'{"prompt_n":7,"prompt_ms":1.5,"predicted_n":33,"predicted_ms":40.2}}\n\n')

STEPS += [
    # Ollama: NDJSON lines, the last one "done": true with its counts at the far end
    (Expect(REQ_MODEL, HttpKind.REQUEST, H.HEADERS_END | H.HAS_LENGTH, method="POST", path="/api/generate",
            content_length=len(MODEL_BODY), header_bytes=len(REQ_MODEL) - len(MODEL_BODY),
            model="llama3.2:1b"),
     [Expect(NDJSON_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.NDJSON_STREAM | H.CHUNKED, status=200,
             header_bytes=len(NDJSON_HEAD), json_lines=0),
      Expect(chunk(OLLAMA_LINE), json_lines=1),
      Expect(chunk(OLLAMA_LINE * 2), json_lines=2),
      Expect(chunk(OLLAMA_DONE) + b"0\r\n\r\n", json_lines=1, flags=H.JSON_DONE | H.CHUNKED_END,
             output_tokens=290)]),
    # JSON Lines closed by the connection, lines cut across writes: a line counts where it ends
    (Expect(REQ_MODEL_LATE + LONG_BODY, HttpKind.REQUEST, H.HEADERS_END | H.HAS_LENGTH, method="POST",
            path="/v1/chat/completions", content_length=len(LONG_BODY), header_bytes=len(REQ_MODEL_LATE),
            model="gpt-4o-mini"),
     [Expect(JSONL_HEAD + b'{"a":1}\r\n{"b":', HttpKind.RESPONSE,
             H.HEADERS_END | H.NDJSON_STREAM | H.CONN_CLOSE, status=200, header_bytes=len(JSONL_HEAD),
             json_lines=1),
      Expect(b'[2]}\n["c"]\n', json_lines=2)]),
    # Anthropic's named events: only the *delta is a token; counts as stated
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(chunk(ANTHROPIC_START), named_events=1, event_name="message_start", input_tokens=25,
             output_tokens=1),
      Expect(chunk(b"event: ping\ndata: {}\n\n"), named_events=1, event_name="ping"),
      Expect(chunk(ANTHROPIC_DELTA), sse_events=1),
      Expect(chunk(b"event:content_block_delta\r\ndata: {}\r\n\r\n" + ANTHROPIC_DELTA), sse_events=2),
      Expect(chunk(ANTHROPIC_END), named_events=2, event_name="message_delta", output_tokens=15),
      # cpp-httplib (llama.cpp's server): the last data chunk, then "0\r\n", then "\r\n"
      # its final chunk's delta is empty: no token
      Expect(chunk(LLAMA_FINAL), output_tokens=33),
      Expect(b"0\r\n", flags=H.LAST_CHUNK),
      Expect(b"\r\n", flags=H.BLANK_LINE_END)]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      # OpenAI's usage chunk and [DONE] with the last chunk's line, then trailers and the blank line
      # (the usage chunk's choices are empty: no token)
      Expect(chunk(b'data: {"choices": [], "x": 1}\n\n'), flags=H(0)),
      Expect(chunk(b'data: {"choices":[{"delta": {}, "finish_reason":"stop"}]}\n\n' + OPENAI_USAGE)
             + b"0\r\n", flags=H.SSE_DONE | H.LAST_CHUNK,
             output_tokens=12, input_tokens=9),
      Expect(b"X-Trailer: 1\r\n\r\n", flags=H.BLANK_LINE_END),
      ]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(chunk(GEMINI_CHUNK), sse_events=1),
      Expect(chunk(GEMINI_LAST) + b"0\r\n\r\n", sse_events=1, output_tokens=14,
             flags=H.CHUNKED_END)]),
    # Node's status line and first events in one writev: the ping past the eighth iovec
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(node_response(ANTHROPIC_START, b'event: content_block_start\ndata: {"i":0}\n\n',
                           b'event: ping\ndata: {"type": "ping"}\n\n'), HttpKind.RESPONSE,
             H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200, header_bytes=len(SSE_HEAD),
             named_events=3, event_name="message_start", input_tokens=25, output_tokens=1),
      # Node corks the writes of one tick into one writev, four iovecs a chunk:
      # the usage is past the eighth iovec, in the second window
      Expect([part for event in (ANTHROPIC_DELTA, b"event: content_block_stop\ndata: {}\n\n",
                                 *ANTHROPIC_END.split(b"\n\n")[:2]) for part in node_chunk(event + b"\n\n")]
             + [b"0\r\n\r\n"],
             sse_events=1, named_events=3, event_name="content_block_stop", output_tokens=15,
             flags=H.CHUNKED_END),
      # the last chunk with its trailers in one write
      Expect(b"0\r\nX-Trailer: 1\r\n\r\n", flags=H.LAST_CHUNK | H.BLANK_LINE_END)]),
    # A stream the close ends, not chunked: an iovec split whose lengths fit Node's chunk
    # framing (size, CRLF, payload, CRLF) is still read, since the response has no framing
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(CLOSE_SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CONN_CLOSE,
             status=200, header_bytes=len(CLOSE_SSE_HEAD)),
      Expect(FRAMING_LOOKALIKE, sse_events=1)]),
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(HUGE_PAYLOAD_SPLIT, sse_events=1)]),
]

# A write longer than the head is scanned in windows that overlap by WINDOW_OVERLAP bytes: an
# event without a token whose "choices":[] or "delta":{} lies in the overlap was once counted
# by both windows, and took a token with it (nginx's proxy buffers put OpenAI's usage chunk there).
USAGE_LINE = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12}}\n\n'
FINISH_LINE = b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}]}\n\n'
IN_OVERLAP = SSE_WINDOW - (SSE_WINDOW - SSE_WINDOW_STEP) // 2   # a byte the first two windows both hold
STEPS += [
    (Expect(REQ_VEC, HttpKind.REQUEST, H.HEADERS_END, method="GET", path="/vec", header_bytes=len(REQ_VEC)),
     [Expect(SSE_HEAD, HttpKind.RESPONSE, H.HEADERS_END | H.EVENT_STREAM | H.CHUNKED, status=200,
             header_bytes=len(SSE_HEAD)),
      Expect(line_at(IN_OVERLAP - USAGE_LINE.index(b"[]"), USAGE_LINE, pad_after=120), sse_events=1,
             output_tokens=12, input_tokens=9),
      Expect(line_at(IN_OVERLAP - FINISH_LINE.index(b"{}"), FINISH_LINE, pad_after=120), sse_events=1),
      Expect(split(line_at(IN_OVERLAP - USAGE_LINE.index(b"[]"), USAGE_LINE, pad_after=120), 100),
             sse_events=1, output_tokens=12, input_tokens=9)]),
]


def ends_with_blank_line(e: Expect) -> bool:
    """What the kernel flags BLANK_LINE_END on every write with a body: it ends
    with an empty line (the sessionizer reads it only after the last chunk)."""
    body = e.payload[e.header_bytes:]
    return e.kind != HttpKind.REQUEST and bool(body) and (body == b"\r\n" or body.endswith(b"\r\n\r\n"))


def observed(e: Expect) -> dict:
    flags = e.flags | (H.BLANK_LINE_END if ends_with_blank_line(e) else H(0))
    return {"kind": e.kind, "flags": flags & FLAGS, "status": e.status, "method": e.method,
            "path": e.path, "content_length": e.content_length, "header_bytes": e.header_bytes,
            "sse_events": e.sse_events, "bytes": len(e.payload),
            **{f: getattr(e, f) for f in STREAM_FIELDS}}


def as_expect(ev: IoRecord) -> dict:
    return {"kind": ev.kind, "flags": ev.flags & FLAGS, "status": ev.status, "method": ev.method,
            "path": ev.path, "content_length": ev.content_length, "header_bytes": ev.header_bytes,
            "sse_events": ev.sse_events, "bytes": ev.bytes,
            **{f: getattr(ev, f) for f in STREAM_FIELDS}}


@pytest.mark.parametrize("pending", ["auto", "hash"])
def test_each_read_and_write_is_classified_as_its_bytes_say(tmp_path, pending, python_script):
    exchanges = [(request.payload, [w.data for w in writes]) for request, writes in STEPS]
    events, counters, pid = scripted_exchange(python_script, tmp_path, exchanges,
                                              options={"sockets": {"pending": pending}})
    io = bytes_moved(events, pid)
    expected = [x for request, writes in STEPS for x in (request, *writes)] + [Expect(b"x")]
    got = [as_expect(e) for e in io]
    for g, x in zip(got, expected, strict=False):
        if x.json_lines is None:
            g["json_lines"] = None
    assert got == [observed(x) for x in expected]
    assert counters["events_lost"] == 0


# Go's net/http reads one byte in the background while a handler runs: a
# keep-alive request that arrives then is read as "P", then "OST /next ...".
SPLIT_READ_SERVER = LISTENING_SERVER + r"""
conn, _ = srv.accept()
conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
first = conn.recv(1)
time.sleep(0.05)
rest = conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
conn.recv(1)
"""


def test_a_request_whose_first_byte_a_one_byte_read_took_is_still_a_request(python_script):
    server = python_script(SPLIT_READ_SERVER)
    port = int(server.stdout.readline())
    with KernelCapture(server.pid) as capture:
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
            client.recv(4096)
            client.sendall(b"P")
            time.sleep(0.02)
            client.sendall(b"OST /next?secret=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
            client.recv(4096)
            client.sendall(b"x")
        server.wait(timeout=10)
        events, _ = capture.finish()
    reads = [e for e in bytes_moved(events, server.pid) if e.is_read]
    # The one-byte read is held (bpf/sock.bpf.c, request_heads_open) and sent as the front of the next.
    assert [(e.kind, e.method, e.path, e.bytes, e.joined_pieces) for e in reads] == [
        (HttpKind.REQUEST, "GET", "/first", 32, 0),
        (HttpKind.REQUEST, "POST", "/next", 60, 1),
        (HttpKind.DATA, None, None, 1, 0),
    ]
    # The request began with its first byte, before the server slept 50 ms and read the rest.
    joined = reads[1]
    assert joined.first_piece_ns is not None and joined.exit_ns - joined.first_piece_ns >= 40_000_000
