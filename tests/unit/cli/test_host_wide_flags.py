"""record --all, agent and report --last refuse bad flag mixes in one sentence, before any BPF."""

from __future__ import annotations

import pytest

from inferprobe.cli.main import main


@pytest.mark.parametrize(("argv", "words"), [
    (["record", "-p", "1", "--all"], "either -p PID or --all"),
    (["record"], "-p PID) or --all"),
    (["record", "-p", "1", "--port", "80"], "select processes for --all"),
    (["record", "--all", "--comm", "a-name-longer-than-15"], "1 to 15 bytes"),
    (["agent", "--keep", "5x"], "not a duration"),
    (["agent", "--max-cpu", "lots"], "not a CPU share"),
    (["agent", "--keep", "1m", "--segment", "5m"], "segment cannot be longer"),
    (["report"], "a recording file or --last SPAN"),
    (["report", "run.ipr", "--last", "5m"], "a recording file or --last SPAN"),
    (["report", "--last", "soon"], "not a duration"),
])
def test_bad_mixes_are_one_sentence(argv, words, capsys, tmp_path):
    if argv[0] == "report" and "--last" in argv:
        argv = [*argv, "--ring", str(tmp_path)]
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 and words in err and "Traceback" not in err, err
