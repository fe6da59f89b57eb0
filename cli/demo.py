"""`inferprobe demo`: the bundled inference server, and a load generator for it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from inferprobe.collector.errors import InferprobeError

EXAMPLES = """
\b
Examples:
  inferprobe demo                                   # serve SmolLM2-135M on 127.0.0.1:8000
  inferprobe demo --port 9000 --max-batch-size 4    # smaller batches, another port
  inferprobe demo --load 8 --duration 20            # 8 streams in flight for 20 s
  inferprobe demo --load 4 --count 40 --json run.json --url http://127.0.0.1:9000
  sudo inferprobe record -p $(pgrep -f 'inferprobe demo$') -d 20 -o demo.ipr
"""


@click.command(epilog=EXAMPLES)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to serve on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to serve on (0: any free port, printed when ready).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Most requests decoded together in one step.")
@click.option("--token-budget", type=click.IntRange(min=1), default=512, show_default=True,
              help="Most prompt tokens prefilled per scheduler iteration.")
@click.option("--kv-capacity", type=click.IntRange(min=1), default=8192, show_default=True,
              help="KV cache size in tokens; a request reserves prompt + max_tokens of it.")
@click.option("--max-tokens-limit", type=click.IntRange(min=1), default=512, show_default=True,
              help="Largest max_tokens a request may ask for.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads for the forward passes. 1 by default: the demo shares a small host "
              "with its load generator and the tracer, and OpenMP threads that spin-wait on busy "
              "cores slow every step down many times over.")
@click.option("--load", "load", type=click.IntRange(min=1), default=None, metavar="N",
              help="Instead of serving: keep N streaming requests in flight against --url.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --load: seconds of load (default 10 unless --count is given).")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="With --load: stop after this many requests.")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True,
              help="With --load: the server to drive.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="With --load: max_tokens of each request.")
@click.option("--chat", is_flag=True, help="With --load: use /v1/chat/completions (default /v1/completions).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="With --load: write the summary and every request's client timestamps here.")
def demo(host, port, max_batch_size, token_budget, kv_capacity, max_tokens_limit, threads,
         load, duration, count, url, max_tokens, chat, json_path) -> None:
    """Serve a real small LLM (SmolLM2-135M-Instruct, CPU) or drive load against it.

    The server speaks the OpenAI API (POST /v1/completions and
    /v1/chat/completions, streaming or not; GET /health, /stats, /v1/models),
    batches requests continuously and fires inferprobe's USDT probes, so
    `inferprobe record` has a realistic target. With --load N it is instead a
    client that keeps N streaming requests in flight, measures TTFT,
    inter-token latency and end-to-end latency itself, and prints p50/p90/p99.
    """
    if load is not None:
        _drive(load, duration, count, url, max_tokens, chat, json_path)
        return
    used = [name for name, value in (("--duration", duration), ("--count", count), ("--json", json_path))
            if value is not None]
    if used or chat:
        raise InferprobeError(f"{(used or ['--chat'])[0]} only applies with --load N", exit_code=2)
    _serve(host, port, max_batch_size, token_budget, kv_capacity, max_tokens_limit, threads)


def _serve(host: str, port: int, max_batch_size: int, token_budget: int, kv_capacity: int,
           max_tokens_limit: int, threads: int) -> None:
    import asyncio

    from inferprobe.demo import model, server

    sock = server.bind(host, port)  # before the model: a busy port fails at once
    port = sock.getsockname()[1]
    click.echo(f"inferprobe demo: loading {model.find_gguf().name} on CPU", err=True)
    lm = model.load(threads=threads)
    from inferprobe.demo.engine import Engine, EngineConfig
    from inferprobe.demo.protocol import Limits
    from inferprobe.demo.runner import ModelRunner

    runner = ModelRunner(lm)
    runner.warm_up()
    engine = Engine(runner, EngineConfig(max_batch_size, token_budget, kv_capacity), lm.eos_ids)
    engine.start()
    api = server.DemoApi(engine, lm.tokenizer, lm.name,
                         Limits(max_tokens_limit, lm.context_length, kv_capacity))

    def ready() -> None:
        click.echo(f"inferprobe demo: serving {lm.name} on http://{host}:{port} "
                   f"(pid {os.getpid()}, model loaded in {lm.load_s:.1f} s)")
        sys.stdout.flush()

    try:
        asyncio.run(server.run(api, sock, ready))
    finally:
        engine.stop()
    click.echo("inferprobe demo: stopped", err=True)


def _drive(load: int, duration: float | None, count: int | None, url: str, max_tokens: int,
           chat: bool, json_path: str | None) -> None:
    from inferprobe.demo import loadgen

    if duration is None and count is None:
        duration = 10.0
    path = "/v1/chat/completions" if chat else "/v1/completions"
    results, wall = loadgen.run(url, concurrency=load, duration_s=duration, count=count,
                                max_tokens=max_tokens, path=path)
    summary = loadgen.summarize(results, wall, loadgen.token_events)
    click.echo(loadgen.format_summary(summary))
    if json_path:
        loadgen.write_json(Path(json_path), summary, results, {
            "url": url, "path": path, "concurrency": load, "duration_s": duration, "count": count,
            "max_tokens": max_tokens, "clock": "CLOCK_MONOTONIC ns"})
        click.echo(f"per-request JSON: {json_path}")
    if summary["completed"] == 0:
        first = next((r.error or f"HTTP {r.status}" for r in results), "no request was sent")
        raise InferprobeError(f"no request completed against {url} (first failure: {first}); "
                              "is `inferprobe demo` running there?")
