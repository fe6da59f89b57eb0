"""`inferprobe doctor`: can this host trace, and if not, what exactly to do."""

from __future__ import annotations

import platform
import sys

import click

from inferprobe.cli.options import apply_btf, btf_option
from inferprobe.collector.attach import preflight
from inferprobe.collector.attach.preflight import Check
from inferprobe.collector.errors import EnvironmentProblem

EXAMPLES = """
\b
Examples:
  sudo inferprobe doctor
  sudo inferprobe doctor --btf /opt/btfhub/5.15.0-91-generic.btf   # a kernel without its own BTF
  sudo inferprobe doctor -p 4242      # also: what of process 4242 it can read (TLS, ...)
\b
Exit status: 0 when `inferprobe record` can trace here, 3 when it cannot.
"""


def _symbols() -> dict[str, str]:
    """✓/✗ where the output encoding has them, plain words where it does not."""
    encoding = getattr(sys.stdout, "encoding", None) or "ascii"
    try:
        "✓✗!".encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return {"pass": "ok", "fail": "FAIL", "warn": "warn"}
    return {"pass": "✓", "fail": "✗", "warn": "!"}


def _status(check: Check, symbols: dict[str, str]) -> tuple[str, str]:
    if check.ok:
        return symbols["pass"], "green"
    if check.required:
        return symbols["fail"], "bold red"
    return symbols["warn"], "yellow"


def _verdict(checks: list[Check]) -> tuple[bool, str]:
    failed = [c.name for c in checks if c.required and not c.ok]
    optional = [c.name for c in checks if not c.required and not c.ok]
    if failed:
        return False, (
            f"Not ready: {len(failed)} required check(s) failed ({', '.join(failed)}); "
            "run the fixes above, then `inferprobe doctor` again."
        )
    text = f"Ready: inferprobe can trace on this host (kernel {platform.release()})."
    if optional:
        text += f" Optional features off: {', '.join(optional)}."
    return True, text


def render(checks: list[Check]) -> tuple[bool, str]:
    """Print the checks table and, for failures, unwrapped fix lines.
    Returns (ready, verdict); a positive verdict is printed here, a negative
    one is left to the caller to raise."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    symbols = _symbols()
    table = Table(title="inferprobe doctor", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True, justify="center")
    table.add_column("detail", overflow="fold")
    table.add_column("fix", overflow="fold")
    for check in checks:
        symbol, style = _status(check, symbols)
        table.add_row(
            Text(check.name),
            Text(symbol, style=style),
            Text(check.detail),
            Text("" if check.ok else check.fix or ""),
        )
    console.print(table)

    failing = [c for c in checks if not c.ok]
    if failing:
        # The table folds long lines; repeat problems unwrapped so the commands
        # can be copied as they are.
        console.print()
        for check in failing:
            symbol, style = _status(check, symbols)
            console.print(Text.assemble((symbol, style), f" {check.name}: {check.detail}"),
                          soft_wrap=True)
            if check.fix:
                console.print(Text(f"    fix: {check.fix}"), soft_wrap=True)

    ready, text = _verdict(checks)
    if ready:
        console.print()
        console.print(Text(text, style="bold green"), soft_wrap=True)
    return ready, text


def render_target(pid: int) -> None:
    """What inferprobe reads of one process (cli/doctor_target.py)."""
    from rich.console import Console
    from rich.text import Text

    from inferprobe.cli.doctor_target import target_lines
    from inferprobe.collector.processes import targets

    targets.check_alive(pid)
    symbols = _symbols()
    console = Console(highlight=False)
    console.print()
    console.print(Text(f"Process {pid}", style="bold"))
    for line in target_lines(pid):
        mark, style = (symbols["pass"], "green") if line.hooked else (symbols["warn"], "yellow")
        console.print(Text.assemble((f"  {mark} ", style), (f"{line.capability}: ", "bold"), line.detail),
                      soft_wrap=True)


@click.command(epilog=EXAMPLES)
@btf_option
@click.option("-p", "--pid", "pids", type=int, multiple=True,
              help="Also say what inferprobe can read of this process (repeat for several).")
def doctor(btf: str | None, pids: tuple[int, ...]) -> None:
    """Check that this host can trace: privileges, bpf(), the kernel version,
    BTF, tracefs, libbpf and the built programs, and a real tracepoint program
    that must load, attach and fire. Prints the exact command for anything
    missing. With -p, also which of a process's libraries and runtimes
    inferprobe hooks (TLS, ...)."""
    apply_btf(btf)
    checks = preflight.run_all()
    ready, verdict = render(checks)
    for pid in pids:
        render_target(pid)
    if not ready:
        # cli/main.py prints it as one sentence and exits 3.
        raise EnvironmentProblem(verdict)
