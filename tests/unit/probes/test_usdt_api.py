"""The Python API without a tracer: arity errors, the untraced fast path, the
live `enabled` attribute, and the fallback when the C extension is missing or
stale. Needs no root."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferprobe.probes import PROBES, usdt

from tests.programs.usdt_trace import HERE, Child


def test_extension_is_loaded():
    assert usdt.available, usdt.reason
    assert usdt.reason is None


def test_enabled_is_a_live_read_not_a_stored_value():
    assert "enabled" not in vars(usdt)
    assert usdt.enabled is False
    assert set(usdt.semaphores()) == {p.name for p in PROBES}
    assert not any(usdt.semaphores().values())


@pytest.mark.parametrize("p", PROBES, ids=lambda p: p.name)
def test_every_probe_is_callable_untraced_and_checks_its_arity(p):
    fn = getattr(usdt, p.name)
    assert fn(*range(len(p.args))) is None
    with pytest.raises(TypeError, match=f"{p.name}.*exactly {len(p.args)}"):
        fn(*range(len(p.args) + 1))
    with pytest.raises(TypeError):
        fn()


def test_untraced_calls_never_look_at_their_arguments():
    # Untraced, a non-int argument is not converted (that would cost time),
    # so it is not counted as skipped either.
    child = Child([sys.executable, str(HERE / "probe_child.py")])
    try:
        assert child.ready_line == "ready 1 -"
        assert child.enabled() is False
        assert child.fire() == 0
    finally:
        child.close()


def run_python(code: str, *xoptions: str) -> str:
    argv = [sys.executable, *(f"-X{x}" for x in xoptions), "-c", code]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=HERE, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_works_without_the_extension():
    child = Child([sys.executable, "-X", "no_extension", str(HERE / "probe_child.py")])
    try:
        status, available, reason = child.ready_line.split(" ", 2)
        assert (status, available) == ("ready", "0")
        assert "C extension did not load" in reason and "ModuleNotFoundError" in reason
        assert child.enabled() is False
        assert child.fire() == 0
    finally:
        child.close()


def test_no_op_functions_keep_the_signatures():
    out = run_python(
        "import sys; sys.modules['inferprobe.probes._usdt'] = None\n"
        "from inferprobe.probes import PROBES, usdt\n"
        "for p in PROBES:\n"
        "    f = getattr(usdt, p.name)\n"
        "    assert f.__name__ == p.name and f(*range(len(p.args))) is None\n"
        "    try:\n"
        "        f(*range(len(p.args) + 1))\n"
        "    except TypeError:\n"
        "        pass\n"
        "    else:\n"
        "        raise SystemExit(p.name + ' accepted too many arguments')\n"
        "print(usdt.available, usdt.enabled, usdt.skipped_calls(), sum(usdt.semaphores().values()))\n"
    )
    assert out.split() == ["False", "False", "0", "0"]


def test_a_stale_extension_is_refused():
    # An extension built from an older table must not be used: its probes
    # would not match what tracers expect.
    out = run_python(
        "import sys, types\n"
        "stale = types.ModuleType('inferprobe.probes._usdt')\n"
        "stale.PROBES = (('request_start', 2),)\n"
        "stale.__file__ = 'stale.so'\n"
        "sys.modules['inferprobe.probes._usdt'] = stale\n"
        "from inferprobe.probes import usdt\n"
        "print(usdt.available, usdt.reason)\n"
        "usdt.request_start(1, 2, 3)\n"
    )
    assert out.startswith("False ") and "does not match the probe table" in out
