"""A recording's metadata through its one typed view: today's recordings, older ones, and the
JSON kept verbatim."""

from __future__ import annotations

import json

import pytest

from inferprobe.collector.errors import RecordingProblem
from inferprobe.collector.model.recording import Recording, RecordingWriter, read_recording
from inferprobe.collector.model.recording_meta import ProbeSets, RecordingMeta, ServingAncestor, Target

TODAY = {
    "inferprobe_version": "0.1.0", "layout_version": 5, "host": "node-1", "kernel": "6.18.0",
    "libbpf_version": "1.1.2", "targets": [{"pid": 41, "comm": "vllm"}, {"pid": 42, "comm": ""}],
    "command_line": ["inferprobe", "record", "-p", "41"], "listening": ["tcp 127.0.0.1:8000"],
    "listening_ancestor": {"pid": 7, "relation": "parent", "listens_too": True,
                           "its_listening": ["tcp :8000"]},
    "started_monotonic_ns": 1_000, "realtime_offset_ns": 2_000,
    "probe_sets": {"active": {"sockets": "HTTP/1.x"}, "inactive": {"gpu": "no CUDA library mapped"}},
    "startup_s": {"prepare": 0.06, "verify": 0.42, "attach": 0.04},
}


def test_todays_metadata_reads_as_typed_fields():
    meta = RecordingMeta(TODAY)
    assert (meta.host, meta.kernel) == ("node-1", "6.18.0")
    assert (meta.inferprobe_version, meta.layout_version) == ("0.1.0", 5)
    assert meta.loader == ("libbpf", "1.1.2")
    assert meta.targets == [Target(41, "vllm"), Target(42, "unknown")]
    assert meta.target_names == {41: "vllm", 42: "unknown"}
    assert meta.listening == ["tcp 127.0.0.1:8000"]
    assert meta.serving_ancestor == ServingAncestor(7, "parent", listens_too=True,
                                                    its_listening=("tcp :8000",))
    assert meta.probe_sets == ProbeSets({"sockets": "HTTP/1.x"}, {"gpu": "no CUDA library mapped"})
    assert meta.probe_sets.present("gpu") and not meta.probe_sets.present("locks")
    assert (meta.started_monotonic_ns, meta.realtime_offset_ns, meta.started_wall_ns) == (1_000, 2_000, 3_000)
    assert meta.startup_s == {"prepare": 0.06, "verify": 0.42, "attach": 0.04}
    assert meta.window is None and meta.earlier_runs == []


def test_an_older_recording_gets_the_defaults_and_its_old_names():
    # Before probe sets had reasons they were a list of names; before libbpf the loader was bcc.
    old = RecordingMeta({"bcc_version": "0.26.0", "probe_sets": ["sockets", "usdt"], "targets": [{"pid": 9}]})
    assert old.loader == ("bcc", "0.26.0")
    assert old.probe_sets == ProbeSets({"sockets": "", "usdt": ""}, {})
    assert old.targets == [Target(9, "unknown")]
    assert old.listening == [] and old.serving_ancestor is None and old.command_line is None
    assert old.started_wall_ns is None and old.startup_s == {} and old.layout_version is None
    assert RecordingMeta({}).loader == ("bcc", None)
    assert RecordingMeta({}).probe_sets == ProbeSets()


def test_the_json_as_written_is_kept_verbatim_and_read_only():
    meta = RecordingMeta(TODAY)
    assert meta.as_json() == TODAY and list(meta) == list(TODAY) and meta["host"] == "node-1"
    with pytest.raises(TypeError):
        meta["host"] = "other"  # type: ignore[index]
    windowed = meta.with_fields(window={"last_s": 60, "earlier_runs": ["r1"]})
    assert windowed.earlier_runs == ["r1"] and meta.window is None
    assert list(windowed)[-1] == "window"
    assert RecordingMeta.of(meta) is meta and RecordingMeta.of(TODAY).host == "node-1"


def test_a_recording_wraps_a_dict_and_reads_its_own_header_back(tmp_path):
    assert isinstance(Recording(path=tmp_path / "x.ipr", meta={"host": "h"}).meta, RecordingMeta)
    path = tmp_path / "r.ipr"
    writer = RecordingWriter(path, TODAY)
    writer.close({"duration_s": 1.0})
    back = read_recording(path)
    assert back.meta.as_json() == json.loads(json.dumps(TODAY, sort_keys=True))
    assert back.meta.serving_ancestor is not None and back.meta.serving_ancestor.pid == 7


def test_a_header_that_is_not_a_json_object_is_refused_in_one_sentence(tmp_path):
    path = tmp_path / "list.ipr"
    RecordingWriter(path, ["not", "an", "object"]).close({})  # type: ignore[arg-type]
    with pytest.raises(RecordingProblem, match="metadata is not a JSON object"):
        read_recording(path)
