"""`inferprobe advise`'s flags and refusals: one sentence and a non-zero exit, no traceback."""

from __future__ import annotations

import subprocess

from tests.support.processes import inferprobe_cmd


def _advise(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(inferprobe_cmd("advise", *args), capture_output=True, text=True)


def test_help_has_examples():
    out = _advise("--help")
    assert out.returncode == 0 and "Examples:" in out.stdout and "--ttft-p99" in out.stdout


def test_a_target_is_required(tmp_path):
    rec = tmp_path / "r.ipr"
    rec.write_bytes(b"")
    out = _advise(str(rec))
    assert out.returncode == 2 and "give a target" in out.stderr and "Traceback" not in out.stderr


def test_a_latency_must_read_as_one(tmp_path):
    rec = tmp_path / "r.ipr"
    rec.write_bytes(b"")
    out = _advise(str(rec), "--ttft-p99", "fast")
    assert out.returncode == 2 and "write it as 800ms or 0.8s" in out.stderr


def test_a_file_that_is_no_recording_gets_one_sentence(tmp_path):
    rec = tmp_path / "r.ipr"
    rec.write_text("not a recording\n")
    out = _advise(str(rec), "--ttft-p99", "800ms")
    assert out.returncode != 0 and out.stderr.startswith("inferprobe: ") and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
