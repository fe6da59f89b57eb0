"""Which tracefs uprobe events a starting tracer removes: those of tracers gone without detaching."""

from __future__ import annotations

import os
import subprocess
import sys

from inferprobe.collector.attach import tracefs_uprobes


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_events_of_gone_tracers_are_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    dead, live, me = _dead_pid(), os.getppid(), os.getpid()
    lines = [
        ("p", "inferprobe_uprobes", "/lib/a.so"),          # the old shared group: unused ones go
        ("p", f"inferprobe_uprobes_{dead}", "/lib/b.so"),  # a killed agent's
        ("r", f"inferprobe_uprobes_{dead}", "/lib/b.so"),
        ("p", f"inferprobe_uprobes_{live}", "/lib/c.so"),  # a running tracer's: kept
        ("p", f"inferprobe_uprobes_{me}", "/lib/d.so"),    # a predecessor with this pid (a container's pid 1)
        ("p", "someone_else/p_ev", "/lib/e.so"),           # not ours
    ]
    (tmp_path / "uprobe_events").write_text("".join(f"{kind}:{group}/{kind}_ev {path}:0x10\n"
                                                    for kind, group, path in lines))
    written: list[str] = []
    monkeypatch.setattr(tracefs_uprobes, "_write_line", lambda _dir, line: written.append(line))
    removed = tracefs_uprobes.remove_stale_events(tmp_path)
    assert written == [f"-:{event}" for event in removed]
    assert removed == ["inferprobe_uprobes/p_ev", f"inferprobe_uprobes_{dead}/p_ev",
                       f"inferprobe_uprobes_{dead}/r_ev", f"inferprobe_uprobes_{me}/p_ev"]


def test_an_event_the_kernel_will_not_remove_is_left_and_not_counted(tmp_path, monkeypatch):
    (tmp_path / "uprobe_events").write_text(f"p:inferprobe_uprobes_{_dead_pid()}/p_ev /lib/a.so:0x10\n")

    def busy(_dir, _line):
        raise OSError(16, "Device or resource busy")   # a probe still uses it

    monkeypatch.setattr(tracefs_uprobes, "_write_line", busy)
    assert tracefs_uprobes.remove_stale_events(tmp_path) == []
    assert tracefs_uprobes.remove_stale_events(tmp_path / "missing") == []


def test_each_tracer_has_its_own_group():
    assert tracefs_uprobes.owner_group() == f"inferprobe_uprobes_{os.getpid()}"
    assert len(tracefs_uprobes.owner_group(4194304)) < tracefs_uprobes.MAX_EVENT_NAME
