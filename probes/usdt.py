"""The probe functions an inference server calls (see inferprobe.probes for the table).

Each probe is a module-level function taking its int64 arguments
positionally, e.g. ``usdt.request_start(req_id, prompt_tokens, conn_fd)``.
Untraced, a call costs one semaphore check inside the C extension.

``usdt.enabled`` is read live from the probes' semaphores on every access:
True while any tracer is attached to any inferprobe probe. Read it as
``usdt.enabled``; ``from ... import enabled`` would freeze one value.

Importing this module never fails because of the tracer: when the C extension
is missing (not built, no <sys/sdt.h> at install time), stale, or broken, the
functions are no-ops with the same signatures, ``available`` is False and
``reason`` says why.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from inferprobe.probes import PROBES, Probe

available: bool = False
reason: str | None = None


def _load() -> Any:
    """The C module, or None after setting ``reason``."""
    global reason
    try:
        from inferprobe.probes import _usdt
    except Exception as e:  # an ImportError, or an OSError from a broken .so: never fatal here
        reason = f"the inferprobe.probes._usdt C extension did not load ({type(e).__name__}: {e})"
        return None
    built = tuple(tuple(row) for row in getattr(_usdt, "PROBES", ()))
    wanted = tuple((p.name, len(p.args)) for p in PROBES)
    if built != wanted:
        reason = (f"the built inferprobe.probes._usdt ({_usdt.__file__}) does not match the probe "
                  "table (a stale build?): reinstall inferprobe to rebuild it")
        return None
    return _usdt


def _noop_for(p: Probe) -> Callable[..., None]:
    # Same arity check as the C functions, so code that runs untraced here
    # also runs against the real extension.
    n = len(p.args)

    def noop(*args: int) -> None:
        if len(args) != n:
            raise TypeError(f"{p.name}() takes exactly {n} positional arguments ({len(args)} given)")

    noop.__name__ = noop.__qualname__ = p.name
    noop.__doc__ = f"No-op ({reason}). {p.doc}"
    return noop


def _always_false(_module: object = None) -> bool:
    return False


def _zero() -> int:
    return 0


_impl = _load()
available = _impl is not None
if _impl is not None:
    for _p in PROBES:
        # The C functions themselves, not wrappers: a Python-level wrapper
        # would cost more than the probe.
        globals()[_p.name] = getattr(_impl, _p.name)
    _enabled_getter: Callable[[object], bool] = _impl._enabled_getter
    skipped_calls: Callable[[], int] = _impl.skipped_calls
    semaphores: Callable[[], dict[str, int]] = _impl.semaphores
else:
    for _p in PROBES:
        globals()[_p.name] = _noop_for(_p)
    _enabled_getter = _always_false
    skipped_calls = _zero

    def semaphores() -> dict[str, int]:
        return {p.name: 0 for p in PROBES}


class _UsdtModule(types.ModuleType):
    # A property on the module's class makes `usdt.enabled` a live read; the
    # getter is the C function itself, so the check costs one C call.
    enabled = property(_enabled_getter)


sys.modules[__name__].__class__ = _UsdtModule

# `enabled` is left out on purpose: a star-import would copy one frozen value.
__all__ = ["available", "reason", "semaphores", "skipped_calls", *(p.name for p in PROBES)]
