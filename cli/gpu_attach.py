"""`inferprobe gpu-attach`: GPU execution times from a running CUDA process, without a restart.

Loads the CUPTI shim into the process (collector/attach/cupti_attach.py) so that its
kernel, copy and memset records reach `record` through the shim's USDT
probes; --detach stops the collection. Flags in, one call out.
"""

from __future__ import annotations

import click

from inferprobe.collector.attach import cupti_attach
from inferprobe.collector.binaries.cupti_shim import ShimStatus
from inferprobe.collector.errors import TargetProblem

EXAMPLES = """
\b
Examples:
  sudo inferprobe gpu-attach -p 4242             load the shim, start CUPTI collection
  sudo inferprobe record -p 4242 -o run.ipr      then record: GPU times come with the requests
  sudo inferprobe gpu-attach -p 4242 --detach    stop collection (the library stays loaded)

\b
At start instead (no debugger): CUDA_INJECTION64_PATH=$(scripts/build_cupti_shim.sh --path) server ...
"""


@click.command("gpu-attach", epilog=EXAMPLES)
@click.option("-p", "--pid", type=int, required=True, help="The CUDA process to attach to.")
@click.option("--detach", is_flag=True, help="Stop the shim's CUPTI collection in the process.")
@click.option("--timeout", type=click.FloatRange(min=1), default=cupti_attach.DEFAULT_TIMEOUT_S,
              show_default=True, help="Seconds to give gdb before giving up.")
def gpu_attach(pid: int, detach: bool, timeout: float) -> None:
    """Load inferprobe's CUPTI shim into a running CUDA process (through gdb).

    Refuses, in one sentence, where that cannot work or is unsafe: ptrace not
    allowed, no CUDA library mapped, no CUDA context yet, shim not built.
    """
    reply = (cupti_attach.detach if detach else cupti_attach.attach)(pid, timeout_s=timeout)
    if reply.status not in (ShimStatus.COLLECTING, ShimStatus.STOPPED):
        # The shim is loaded and will say the same to a recorder; the exit code says it is not collecting.
        raise TargetProblem(f"CUPTI was not collecting in pid {pid}: {reply.sentence}" if detach
                            else reply.sentence)
    click.echo(f"gpu-attach: {reply.sentence}")
