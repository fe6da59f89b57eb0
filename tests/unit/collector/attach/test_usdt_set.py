"""The recorder's USDT probe set follows the probe library's table: ids and the arguments read.

What the kernel then sends back is tests/integration/collector/attach/test_usdt_set.py.
"""

from __future__ import annotations

from inferprobe.collector.model.events import UsdtProbe
from inferprobe.collector.model.layout_generated import USDT_MAX_ARGS
from inferprobe.probes import PROBES


def test_collector_probe_ids_follow_the_library_table():
    assert [p.name.upper() for p in PROBES] == [m.name for m in UsdtProbe]
    assert [m.value for m in UsdtProbe] == list(range(1, len(PROBES) + 1))


def test_the_one_handler_has_room_for_every_documented_argument():
    # bpf/usdt.bpf.c copies at most USDT_MAX_ARGS arguments of whichever probe fired.
    assert max(len(p.args) for p in PROBES) <= USDT_MAX_ARGS

