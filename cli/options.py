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

btf_option = click.option(
    "--btf",
    type=click.Path(dir_okay=False, exists=True),
    envvar="INFERPROBE_BTF",
    default=None,
    help="This kernel's BTF as a file, where the kernel exposes none (/sys/kernel/btf/vmlinux): "
    "BTFHub has them for distribution kernels. libbpf relocates the programs with it. "
    "Env: INFERPROBE_BTF.",
)


def apply_btf(path: str | None) -> None:
    """The loader (collector/attach/libbpf.py) reads INFERPROBE_BTF when it opens an object."""
    import os

    if path:
        os.environ["INFERPROBE_BTF"] = os.path.abspath(path)
