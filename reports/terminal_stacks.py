"""The flame graph sections in the terminal report (recordings made with
--profile / --offcpu): capture facts and the heaviest frames, no picture."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inferprobe.reports.sections.model import AnalyzerSection
from inferprobe.reports.sections.stacks import ANCHORS


def render_stacks(sections: Sequence[AnalyzerSection], console: Console) -> None:
    for sec in sections:
        if sec.anchor not in ANCHORS.values():
            continue
        states = ", ".join(f"{s.name} {'on' if s.active else 'off'}" for s in sec.sources)
        console.print(f"[bold]{escape(sec.title)}[/bold]  ({escape(states)}; `inferprobe flamegraph` "
                      "draws it)", highlight=False)
        for t in sec.tables:
            table = Table(title=t.caption, title_justify="left")
            for i, col in enumerate(t.columns):
                table.add_column(col, justify="left" if i == 0 else "right")
            for row in t.rows:
                table.add_row(*(escape(c) for c in row))
            console.print(table)
        for note in sec.notes:
            console.print(f"note: {escape(note)}", highlight=False)
