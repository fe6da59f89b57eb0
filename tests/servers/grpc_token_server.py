"""A gRPC token-streaming service on grpcio, with no generated code.

Generic handlers serve /llm.Generator/Stream (server streaming: one message
per token, the count and pace from the request) and /llm.Generator/Complete
(unary). Requests and replies are JSON bytes, so the test needs no protobuf
compiler. Prints "listening PORT" once the port is bound.

    python grpc_token_server.py [--port 0]
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent import futures

import grpc


def _stream(request: bytes, context) -> object:
    ask = json.loads(request)
    time.sleep(ask.get("first_delay_ms", 20) / 1000)
    for i in range(ask["tokens"]):
        if i:
            time.sleep(ask.get("gap_ms", 10) / 1000)
        yield json.dumps({"index": i, "text": ask.get("secret", "") + f" token{i}"}).encode()


def _complete(request: bytes, context) -> bytes:
    ask = json.loads(request)
    time.sleep(ask.get("first_delay_ms", 20) / 1000)
    return json.dumps({"text": "done", "tokens": ask.get("tokens", 1)}).encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    handlers = {
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        "Complete": grpc.unary_unary_rpc_method_handler(_complete),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("llm.Generator", handlers),))
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"listening {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
