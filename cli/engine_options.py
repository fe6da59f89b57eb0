"""`--engine-metrics URL` / `--no-engine-metrics`, shared by record and top."""

from __future__ import annotations

from collections.abc import Callable

import click

from inferprobe.collector.attach.engine_scrape import discover, looks_like_engine, parse_url, probe
from inferprobe.collector.processes import targets as target_procs


def engine_metrics_options(f: Callable) -> Callable:
    f = click.option("--no-engine-metrics", is_flag=True,
                     help="Do not look for or scrape the engine's /metrics.")(f)
    return click.option(
        "--engine-metrics", "engine_metrics_url", metavar="URL", default=None,
        help="Scrape the engine's own Prometheus endpoint (vLLM, SGLang, llama.cpp --metrics, TGI) "
        "every 250 ms: its queue, running requests, KV use and TTFT beside the wire's "
        "(docs/engines.md). Default: found by itself when a target that is a known engine (vLLM, SGLang, "
        "llama.cpp's server, TGI, Ollama, by its command line or libllama) serves /metrics on its own port.",
    )(f)


def engine_metrics_source(pids: list[int], url: str | None, off: bool = False) -> tuple[str, str] | None:
    """(url, how it was found) of the engine's /metrics, or None: the URL given
    (refused in one sentence when it does not answer with Prometheus text), else
    the first of the targets' listening ports that serves /metrics. Call it
    before attaching, so that looking is not recorded as the server's traffic."""
    if off:
        return None
    if url is not None:
        try:
            url = parse_url(url).url
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--engine-metrics") from None
        if not probe(url, timeout_s=2.0):
            raise click.BadParameter(f"{url} does not answer with Prometheus metrics (is the engine "
                                     "started with its metrics on, e.g. llama-server --metrics?)",
                                     param_hint="--engine-metrics")
        return url, "given"
    # Only an engine's own ports are asked: a GET /metrics sent to any other server
    # is a request it did not expect (some answer it badly, a TLS port not at all).
    engines = [pid for pid in target_procs.with_descendants(pids) if looks_like_engine(pid)]
    if not engines:
        return None
    found = discover(target_procs.listening_sockets(engines))
    return None if found is None else (found, "auto-detected on the target's port")
