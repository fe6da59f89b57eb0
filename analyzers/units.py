"""The one millisecond formatter: every table cell, sentence and renderer
shows a time through it, so the same number reads the same everywhere.

It lives with the analyzers (not in reports/) because analyzers write
sentences with times in them (findings), and analyzers import no renderer.
"""

from __future__ import annotations


def ms(ns: float | None, places: int | None = 2, unit: bool = False) -> str:
    """A time given in ns, in milliseconds; "-" when it is unknown.

    places: decimals (2 in tables); None for three significant figures, as a
    sentence reads best ("412 ms", "41.2 ms", "4.12 ms").
    unit: append " ms" (sentences; tables say the unit in their header).
    """
    if ns is None:
        return "-"
    value = ns / 1e6
    if places is None:
        places = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{places}f}" + (" ms" if unit else "")


def ms_text(ns: float | None) -> str:
    """A time for a sentence: three significant figures and the unit ("41.2 ms")."""
    return ms(ns, places=None, unit=True)


def duration(ns: int) -> str:
    """A duration as a person reads it in a sum: "12.03 s" from a second on, "41.2 ms" below."""
    return f"{ns / 1e9:.2f} s" if ns >= 1_000_000_000 else ms(ns, 1, unit=True)


def us(ns: float | None, places: int = 1) -> str:
    """A time given in ns, in microseconds (GPU kernels, copies); "-" when it is unknown."""
    return "-" if ns is None else f"{ns / 1e3:.{places}f}"
