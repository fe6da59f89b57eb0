"""USDT probes an inference server fires so inferprobe can see inside it.

The table below is the contract (docs/usdt-probes.md): probe names, argument
names and argument order, provider ``inferprobe``, every argument an int64.
It is the one source of that contract in this repository: the C extension
(``_usdt.c``), the C/C++ header (``include/inferprobe/usdt.h``) and the type
stubs are each checked against it by tests/unit/probes and tests/integration/probes.

Servers use :mod:`inferprobe.probes.usdt`::

    from inferprobe.probes import usdt

    usdt.request_start(req_id, prompt_tokens, conn_fd)   # near free untraced
    if usdt.enabled:                                     # skip costly arguments
        usdt.request_start(hash_request_id(rid), len(tokens), fd)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["PROBES", "PROVIDER", "Probe", "include_dir", "probe"]

PROVIDER = "inferprobe"


@dataclass(frozen=True)
class Probe:
    name: str
    args: tuple[str, ...]
    doc: str


PROBES: tuple[Probe, ...] = (
    Probe("request_start", ("req_id", "prompt_tokens", "conn_fd"),
          "the server accepted a request (parsed, tokenized); conn_fd is the socket fd it arrived on, "
          "or -1 when the server cannot tell"),
    Probe("request_queued", ("req_id", "queue_depth"),
          "the request entered the waiting queue; queue_depth counts waiting requests including it"),
    Probe("request_scheduled", ("req_id", "batch_size"),
          "the scheduler admitted it to the running batch (KV cache reserved); batch_size counts "
          "running requests including it"),
    Probe("prefill_start", ("req_id", "prompt_tokens"), "prefill (the prompt's forward pass) begins"),
    Probe("prefill_end", ("req_id", "prompt_tokens"), "prefill done (the first token is sampled)"),
    Probe("decode_step_start", ("step_id", "batch_size", "tokens_in_batch"),
          "one decode step over the running batch begins"),
    Probe("decode_step_end", ("step_id", "batch_size", "tokens_in_batch"), "that decode step ended"),
    Probe("token_emit", ("req_id", "token_index"),
          "token number token_index (0 = first) of req_id was produced and handed to the API layer"),
    Probe("request_end", ("req_id", "output_tokens", "status"),
          "the request left the server; status 0 ok, 1 client disconnected/aborted, 2 server error, "
          "3 rejected"),
    Probe("queue_depth", ("waiting", "running"), "scheduler state, once per scheduler iteration"),
    Probe("kv_usage", ("used", "capacity"), "KV cache occupancy, tokens or blocks (one unit for both)"),
)

_BY_NAME = {p.name: p for p in PROBES}


def probe(name: str) -> Probe:
    """The probe called ``name``; KeyError names the known ones."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no inferprobe probe {name!r}; known: {', '.join(_BY_NAME)}") from None


def include_dir() -> Path:
    """Directory to pass as ``-I`` to compile C/C++ against ``<inferprobe/usdt.h>``."""
    return Path(__file__).resolve().parent / "include"
