"""--all and its filters, shared by `record` and `agent` (docs/deploy.md)."""

from __future__ import annotations

import click

from inferprobe.collector.processes import host_wide


def host_wide_options(f):
    for decorator in reversed([
        click.option("--all", "all_hosts", is_flag=True,
                     help="No -p: every process on the host that serves HTTP, including ones started "
                     "later (found by their listening sockets and the first request line they read)."),
        click.option("--port", "ports", type=click.IntRange(1, 65535), multiple=True,
                     help="With --all: only processes listening on this TCP port (repeat for several)."),
        click.option("--comm", default=None,
                     help="With --all: only processes of this name (the kernel's comm, up to 15 bytes)."),
        click.option("--cgroup", default=None,
                     help="With --all: only processes in this cgroup v2 group or below it, e.g. "
                     "/kubepods.slice (relative to the cgroup2 mount, or a path under it)."),
    ]):
        f = decorator(f)
    return f


def host_wide_filters(pids: tuple[int, ...], all_hosts: bool, ports: tuple[int, ...], comm: str | None,
                      cgroup: str | None) -> host_wide.Filters | None:
    """The filters when recording host-wide, None for -p; refuses a mix in one sentence."""
    if pids and all_hosts:
        raise click.UsageError("give either -p PID or --all, not both")
    if not pids and not all_hosts:
        raise click.UsageError("give the server's pid (-p PID) or --all for every server on the host")
    if not all_hosts:
        if ports or comm or cgroup:
            raise click.UsageError("--port, --comm and --cgroup select processes for --all; with -p "
                                   "the pids say which")
        return None
    return host_wide.make_filters(ports, comm, cgroup)


def listening_now(filters: host_wide.Filters) -> list[int]:
    """The processes already listening that pass the filters: the first targets."""
    serving = host_wide.ListenerScan().scan()
    return host_wide.matching_listeners(filters, serving)
