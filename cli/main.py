"""The `inferprobe` command: a click group that catches InferprobeError once.

Each subcommand lives in its own module; this file only wires them up and
turns library errors into one sentence and an exit code (no tracebacks for
problems the user can fix).
"""

from __future__ import annotations

import sys

import click

from inferprobe.collector.errors import InferprobeError


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("inferprobe")
    except PackageNotFoundError:
        return "0+unknown"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(_version(), prog_name="inferprobe")
def cli() -> None:
    """eBPF latency tracing for LLM inference servers.

    Run `inferprobe doctor` first on a new host, then `inferprobe record`
    next to a running server and `inferprobe report` on the recording.
    """


def _register() -> None:
    from inferprobe.cli.advise import advise
    from inferprobe.cli.agent import agent
    from inferprobe.cli.demo import demo
    from inferprobe.cli.doctor import doctor
    from inferprobe.cli.export import export
    from inferprobe.cli.flamegraph import flamegraph
    from inferprobe.cli.gpu_attach import gpu_attach
    from inferprobe.cli.record import record
    from inferprobe.cli.report import report
    from inferprobe.cli.top import top

    cli.add_command(advise)
    cli.add_command(agent)
    cli.add_command(demo)
    cli.add_command(doctor)
    cli.add_command(export)
    cli.add_command(record)
    cli.add_command(report)
    cli.add_command(top)
    cli.add_command(flamegraph)
    cli.add_command(gpu_attach)


_register()


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
