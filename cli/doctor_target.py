"""`inferprobe doctor -p PID`: what inferprobe can read of one target, capability by capability.

The host checks (cli/doctor.py) say whether tracing works here at all; these
say, for a given process, which of its libraries and runtimes inferprobe
hooks and which it cannot read, with the reason, before a recording comes
back empty. Each capability is one function returning its lines; a new one
is one more entry in TARGET_CHECKS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TargetLine:
    capability: str  # "TLS", ...
    hooked: bool  # inferprobe reads it
    detail: str  # what was found, and why not where it is not read


def tls_lines(pid: int) -> list[TargetLine]:
    from inferprobe.collector.binaries.go_binary import go_tls_targets
    from inferprobe.collector.binaries.tls_libraries import linked_tls, tls_libraries

    # rustls first: a process that links it (granian serving HTTPS) often maps libssl as well
    # (Python's ssl module), which would otherwise read as the answer.
    lines = [TargetLine("TLS", False, f"rustls {lib.version} linked into {lib.path}: Rust's TLS, compiled in "
                                      "without functions inferprobe can hook; connections it encrypts show "
                                      "as unrecognised traffic, not as requests")
             for lib in linked_tls(pid)]
    for lib in tls_libraries(pid):
        if lib.hookable and lib.kind == "rustls":
            name = f"rustls {lib.version}" if lib.version else "rustls"
            lines.append(TargetLine("TLS", True, f"{name} compiled into {lib.path}, with its symbols: hooks "
                                                 "Reader::read and Writer::write"))
        elif lib.kind == "rustls":
            lines.append(TargetLine("TLS", False, f"rustls compiled into {lib.path}: how its rustc returns "
                                                  "a Result was not recognised in its code, so it is not "
                                                  "hooked; its connections show as unrecognised traffic"))
        elif lib.hookable:
            functions = ", ".join(sorted(lib.functions))
            where = "linked into the executable" if lib.kind == "openssl-static" else "shared library"
            lines.append(TargetLine("TLS", True, f"OpenSSL ({where}) {lib.path}: hooks {functions}"))
        else:
            lines.append(TargetLine("TLS", False, f"{lib.kind} {lib.path}: not a library inferprobe reads; "
                                                  "its connections show as unrecognised traffic"))
    for target in go_tls_targets(pid):
        verdict = target.verdict
        if target.probes is not None:
            lines.append(TargetLine("TLS", True, f"Go crypto/tls ({verdict.go_version}) in {target.path}: "
                                                 "hooks (*Conn).Read and (*Conn).Write at entry and returns"))
        else:
            lines.append(TargetLine("TLS", False, f"Go crypto/tls in {target.path}: {verdict.reason}"))
    if not lines:
        lines.append(TargetLine("TLS", False, "no TLS library mapped: plaintext sockets only "
                                              "(record --tls watches for one loaded later)"))
    return lines


def python_lines(pid: int) -> list[TargetLine]:
    from inferprobe.collector.binaries.python_threads import describe

    found = describe(pid)
    return [TargetLine("Python", found[0], found[1])] if found else []


def engine_lines(pid: int) -> list[TargetLine]:
    """llama.cpp found in the target (hooked through uprobes), and the engine's own /metrics."""
    from inferprobe.collector.attach.engine_scrape import discover
    from inferprobe.collector.attach.probe_sets.llama import llama_targets
    from inferprobe.collector.processes import targets

    lines = []
    found = llama_targets(pid)
    for mapped, api in found:
        if api.refusal:
            lines.append(TargetLine("llama.cpp", False, api.refusal))
            continue
        lines.append(TargetLine("llama.cpp", True,
                                f"{api.kind} in {mapped.path}: hooks it (uprobes): engine steps, "
                                "per-request queue, prefill and decode, batch sizes"))
    url = discover(targets.listening_sockets([pid]))
    if url is not None:
        lines.append(TargetLine("Engine metrics", True, f"{url}: record scrapes it every 250 ms "
                                                        "(queue, running requests, KV use, TTFT)"))
    elif found:
        lines.append(TargetLine("Engine metrics", False,
                                "no /metrics on the target's ports: start llama-server with --metrics "
                                "for its own queue gauge (llamacpp:requests_deferred)"))
    return lines


TARGET_CHECKS: list[Callable[[int], list[TargetLine]]] = [tls_lines, python_lines, engine_lines]


def target_lines(pid: int) -> list[TargetLine]:
    return [line for check in TARGET_CHECKS for line in check(pid)]
