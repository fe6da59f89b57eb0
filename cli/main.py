"""The `inferprobe` command: a click group that catches InferprobeError once.

Each subcommand lives in its own module; this file only wires them up and
turns library errors into one sentence and an exit code (no tracebacks for
problems the user can fix).
"""

from __future__ import annotations

import importlib
import sys

import click

from inferprobe.collector.errors import InferprobeError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferprobe")
    except PackageNotFoundError:
        return "0+unknown"


# Each command by the module that defines it, imported only when that command runs (or
# `--help` lists them all): `record` pulls in libbpf, the loader and every probe set, which an
# offline `report` on a laptop never needs. click's documented lazy-loading pattern.
COMMANDS = {
    "advise": "inferprobe.cli.advise:advise",
    "agent": "inferprobe.cli.agent:agent",
    "demo": "inferprobe.cli.demo:demo",
    "doctor": "inferprobe.cli.doctor:doctor",
    "export": "inferprobe.cli.export:export",
    "flamegraph": "inferprobe.cli.flamegraph:flamegraph",
    "gpu-attach": "inferprobe.cli.gpu_attach:gpu_attach",
    "record": "inferprobe.cli.record:record",
    "report": "inferprobe.cli.report:report",
    "top": "inferprobe.cli.top:top",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attr = COMMANDS[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command) and command.name == cmd_name, COMMANDS[cmd_name]
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), prog_name="inferprobe")
def cli() -> None:
    """eBPF latency tracing for LLM inference servers.

    Run `inferprobe doctor` first on a new host, then `inferprobe record`
    next to a running server and `inferprobe report` on the recording.
    """


def main(argv: list[str] | None = None) -> int:
    try:
        # standalone_mode=False hands back ctx.exit(n)'s code instead of exiting
        rc = cli.main(args=argv, prog_name="inferprobe", standalone_mode=False)
    except InferprobeError as err:
        click.echo(f"inferprobe: {err}", err=True)
        return err.exit_code
    except click.exceptions.Abort:
        click.echo("inferprobe: aborted", err=True)
        return 130
    except click.ClickException as err:
        err.show()
        return err.exit_code
    except click.exceptions.Exit as err:
        return err.exit_code
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
