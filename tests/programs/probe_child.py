"""Fires every inferprobe probe from Python on command (protocol: usdt_trace.py).

Run with -X no_extension to simulate a missing C extension.
"""

from __future__ import annotations

import sys

if "no_extension" in sys._xoptions:
    # None in sys.modules makes `import inferprobe.probes._usdt` raise ImportError.
    sys.modules["inferprobe.probes._usdt"] = None

from inferprobe.probes import PROBES, usdt  # noqa: E402

from usdt_trace import INT64_MAX, INT64_MIN, value  # noqa: E402


def fire() -> None:
    for i, p in enumerate(PROBES):
        getattr(usdt, p.name)(*(value(i, j) for j in range(len(p.args))))
    usdt.request_start(INT64_MAX, INT64_MIN, -1)
    # Neither fits an int64: while traced these are skipped (and counted),
    # never raised, and never emitted.
    usdt.request_start(1.5, 0, 0)
    usdt.token_emit(2**63, 0)


def main() -> None:
    print("ready", int(usdt.available), usdt.reason or "-", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "enabled":
            print("enabled", int(usdt.enabled), flush=True)
        elif command == "fire":
            fire()
            print("fired", usdt.skipped_calls(), flush=True)
        else:
            print("unknown command", command, flush=True)


if __name__ == "__main__":
    main()
