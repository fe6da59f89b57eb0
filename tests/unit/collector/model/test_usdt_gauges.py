"""The engine's gauges read from its USDT probes in one place (UsdtRecord), for the report,
the live view and the metrics alike."""

from __future__ import annotations

from inferprobe.collector.model.events import UsdtProbe, UsdtRecord, decode

from tests.factories import usdt as usdt_bytes


def usdt(probe: UsdtProbe, *args: int) -> UsdtRecord:
    """The probe's firing as the recording's decoder reads it."""
    record = decode(usdt_bytes(probe, *args))
    assert isinstance(record, UsdtRecord)
    return record


def test_queue_depth_is_waiting_and_running_of_its_probe_only():
    assert usdt(UsdtProbe.QUEUE_DEPTH, 3, 4).queue_depth == (3, 4)
    assert usdt(UsdtProbe.QUEUE_DEPTH, 3).queue_depth is None   # a probe fired without its second argument
    assert usdt(UsdtProbe.KV_USAGE, 3, 4).queue_depth is None


def test_kv_used_is_a_share_and_none_without_a_capacity():
    assert usdt(UsdtProbe.KV_USAGE, 30, 120).kv_used == 0.25
    assert usdt(UsdtProbe.KV_USAGE, 30, 0).kv_used is None
    assert usdt(UsdtProbe.QUEUE_DEPTH, 30, 120).kv_used is None
