"""Flags shared by several commands, with one meaning everywhere."""

from __future__ import annotations

import click

pid_option = click.option(
    "-p",
    "--pid",
    "pids",
    type=int,
    multiple=True,
    required=True,
    help="Process to trace (repeat for several). Its threads and children, "
    "including ones started later, are traced too.",
)

# `record` also runs without pids (--all): the same flag, not required there.
optional_pid_option = click.option(
    "-p",
    "--pid",
    "pids",
    type=int,
    multiple=True,
    help="Process to trace (repeat for several). Its threads and children, "
    "including ones started later, are traced too. Without it, --all.",
)

duration_option = click.option(
    "-d",
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to record; default: until Ctrl-C or SIGTERM.",
)

kernel_headers_option = click.option(
    "--kernel-headers",
    type=click.Path(file_okay=False),
    envvar="INFERPROBE_KERNEL_HEADERS",
    default=None,
    help="Kernel headers directory for bcc (default: /lib/modules/$(uname -r)/build). "
    "Env: INFERPROBE_KERNEL_HEADERS.",
)


def apply_kernel_headers(path: str | None) -> None:
    """bcc reads BCC_KERNEL_SOURCE when it compiles: set it before loading."""
    import os

    if path:
        os.environ["BCC_KERNEL_SOURCE"] = path
