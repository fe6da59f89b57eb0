"""Bad input gets one clear sentence, a non-zero exit and no traceback: the cases that need no root."""

from __future__ import annotations

from inferprobe.collector.errors import RecordingProblem

from tests.support.cli import assert_one_sentence, run_inferprobe


def test_duration_not_a_number(tmp_path):
    result = run_inferprobe("record", "-p", "1", "-d", "soon", "-o", str(tmp_path / "r.ipr"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "'soon' is not a valid float" in result.stderr


def test_corrupt_recording(tmp_path):
    path = tmp_path / "bad.ipr"
    path.write_bytes(b"definitely not a recording")
    result = run_inferprobe("report", str(path))
    assert_one_sentence(result, RecordingProblem.exit_code, "not an inferprobe recording")


def test_missing_recording(tmp_path):
    result = run_inferprobe("report", str(tmp_path / "none.ipr"))
    assert_one_sentence(result, RecordingProblem.exit_code, "no recording at")
