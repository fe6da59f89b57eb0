"""The recorder's USDT probe set follows the probe library's table: ids and the arguments read.

What the kernel then sends back is tests/integration/collector/attach/test_usdt_set.py.
"""

from __future__ import annotations

import re

from inferprobe.collector.attach.loader import BPF_DIR
from inferprobe.collector.model.events import UsdtProbe
from inferprobe.probes import PROBES


def test_collector_probe_ids_follow_the_library_table():
    assert [p.name.upper() for p in PROBES] == [m.name for m in UsdtProbe]
    assert [m.value for m in UsdtProbe] == list(range(1, len(PROBES) + 1))


def test_each_bpf_handler_reads_exactly_the_documented_arguments():
    source = (BPF_DIR / "usdt.bpf.c").read_text()
    for p in PROBES:
        body = re.search(rf"int usdt_{p.name}\(struct pt_regs \*ctx\)\n\{{(.*?)\n\}}", source, re.S)
        assert body, f"no handler for {p.name}"
        reads = re.findall(r"bpf_usdt_readarg\((\d), ctx, &ev\.args\[(\d)\]\)", body.group(1))
        assert [(int(a), int(b)) for a, b in reads] == [(i + 1, i) for i in range(len(p.args))], p.name
        assert f"usdt_begin(&ev, USDT_{p.name.upper()}, {len(p.args)})" in body.group(1)
