"""An SSE server that loads TLS only when told to: a TLS library mapped after the tracer attached.

Usage: late_tls_sse.py CERT KEY LOG. Prints its port, then waits for a line
on stdin; only then imports ssl (which maps _ssl and libssl.so into the
process: nothing before it does), prints "tls", and serves HTTPS on the
socket it already listens on, one connection at a time, keep-alive, through
blocking ssl sockets (a socket BIO: OpenSSL writes to the socket itself).
POST a JSON body {"tokens", "interval_ms"}: the answer is a chunked
text/event-stream of that many OpenAI-style events and [DONE]. Appends one
JSON line per response to LOG: the CLOCK_MONOTONIC ns taken just before each
token's write.
"""

import json
import socket
import sys
import time


def read_request(conn) -> bytes | None:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return None
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return body


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def serve(conn, log) -> None:
    while (body := read_request(conn)) is not None:
        asked = json.loads(body)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        token_ns = []
        for i in range(asked["tokens"]):
            time.sleep(asked["interval_ms"] / 1000)
            event = json.dumps({"choices": [{"delta": {"content": f"word{i} "}}]}).encode()
            token_ns.append(time.monotonic_ns())
            conn.sendall(chunk(b"data: " + event + b"\n\n"))
        conn.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        log.write(json.dumps({"token_ns": token_ns}) + "\n")
        log.flush()


def main() -> None:
    cert, key, log_path = sys.argv[1:4]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    print(listener.getsockname()[1], flush=True)
    sys.stdin.readline()
    import ssl  # noqa: PLC0415 - the point: libssl is mapped only now

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    print("tls", flush=True)
    with open(log_path, "a") as log, context.wrap_socket(listener, server_side=True) as tls_listener:
        while True:
            try:
                conn, _ = tls_listener.accept()
            except ssl.SSLError:
                continue  # a client that spoke no TLS (a plain-HTTP probe of the port): next
            with conn:
                serve(conn, log)


if __name__ == "__main__":
    main()
