"""`record` flags for stack capture (on-CPU and off-CPU), kept apart from
record.py so the stack sets can grow flags without touching it."""

from __future__ import annotations

import click

from inferprobe.collector.attach.probe_sets.stacks import DEFAULT_HZ, DEFAULT_OFFCPU_MIN_US

_OPTIONS = [
    click.option(
        "--profile",
        is_flag=True,
        help=f"Sample on-CPU stacks of the targets' threads (cpu-clock perf event, {DEFAULT_HZ} Hz "
        "by default). Cost: a small BPF program and two stack walks per sample, on the sampled "
        "CPU; measured on a busy 2-core VM (benchmarks/bench_profile.py): server CPU per request "
        "+9 % at 99 Hz and +21 % at 999 Hz over socket tracing alone, 49 Hz lost in the noise; "
        "plus a few seconds at stop to name the frames.",
    ),
    click.option(
        "--profile-hz",
        type=click.IntRange(1, 10000),
        default=DEFAULT_HZ,
        show_default=True,
        help="On-CPU sampling rate per CPU (tests use 299; benchmarks/bench_profile.py "
        "measures 49, 99 and 999).",
    ),
    click.option(
        "--offcpu",
        is_flag=True,
        help="Record where the targets' threads wait (stacks at sched_switch, weighted by time "
        "off the CPU). Cost: two stack walks on every context switch of a target thread "
        "(about 1-2 µs each), whether or not the wait is long enough to keep.",
    ),
    click.option(
        "--offcpu-min-us",
        type=click.IntRange(1, None),
        default=DEFAULT_OFFCPU_MIN_US,
        show_default=True,
        help="Shortest off-CPU period kept, in microseconds (shorter ones are only counted).",
    ),
    click.option(
        "--phases",
        is_flag=True,
        help="Also stream every stack sample with its time, so `flamegraph --phase` can split "
        "by request phase. Cost: one ring-buffer event per sample (about 10 µs of recorder CPU).",
    ),
]


STACK_FLAGS = ("profile", "profile_hz", "offcpu", "offcpu_min_us", "phases")


def stack_options(fn):
    for option in reversed(_OPTIONS):
        fn = option(fn)
    return fn


def stack_sets(flags: dict) -> tuple[str, ...]:
    sets: tuple[str, ...] = ()
    if flags.get("profile"):
        sets += ("profile",)
    if flags.get("offcpu"):
        sets += ("offcpu",)
    return sets


def stack_set_options(flags: dict) -> dict:
    return {
        "profile_hz": flags.get("profile_hz", DEFAULT_HZ),
        "offcpu_min_us": flags.get("offcpu_min_us", DEFAULT_OFFCPU_MIN_US),
        "phases": bool(flags.get("phases")),
    }
