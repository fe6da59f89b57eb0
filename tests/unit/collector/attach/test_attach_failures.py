"""Failed attaches: recorded per process, said once, counted by probe set; tracefs event names that fit."""

from __future__ import annotations

import re

from inferprobe.collector.attach.attach_failures import RECENT_KEPT, AttachFailures, describe
from inferprobe.collector.attach.tracefs_uprobes import MAX_EVENT_NAME, short_event_name


def test_each_failure_is_said_once_and_counted_by_probe_set():
    failures = AttachFailures()
    failures.add_functions(10, "tls", "/usr/lib/libssl.so.3",
                           {"SSL_write": "refused (Invalid argument)", "SSL_read": "refused (EINVAL)"})
    failures.add(11, "usdt", "its USDT probes", "the process\nexited")
    failures.add_functions(12, "tls", "/lib/other.so", {})   # nothing failed: nothing recorded
    first = failures.take_unsaid()
    assert [(f.pid, f.probe_set) for f in first] == [(10, "tls"), (11, "usdt")]
    assert first[0].target == "SSL_read, SSL_write in /usr/lib/libssl.so.3"
    assert first[0].error == "refused (EINVAL)" and first[1].error == "the process exited"   # one line
    assert failures.take_unsaid() == []
    assert failures.as_dict()["by_probe_set"] == {"tls": 1, "usdt": 1} and failures.total == 2
    line = describe(first[0], "python")
    assert line.startswith("attach failed: tls in pid 10 (python): SSL_read, SSL_write in /usr/lib/")


def test_the_recent_list_is_bounded_and_the_counts_are_not():
    failures = AttachFailures()
    for pid in range(RECENT_KEPT + 10):
        failures.add(pid, "tls", "x", "y")
    assert len(failures.as_dict()["recent"]) == RECENT_KEPT and failures.total == RECENT_KEPT + 10


def test_tracefs_event_names_fit_the_kernel_and_stay_distinct():
    long_path = "/proc/4194303/root/usr/lib/x86_64-linux-gnu/some-very-long-library-name.so.3.0.11"
    names = {short_event_name(on_return, path, offset, pid)
             for on_return in (False, True)
             for path in (long_path, long_path.replace("/usr/", "/opt/"))
             for offset in (0x35430, 0xffffffffffff)
             for pid in (-1, 4194303)}
    assert len(names) == 16
    for name in names:
        # the kernel refuses 64 characters or more
        assert len(name) <= MAX_EVENT_NAME and re.fullmatch(r"[A-Za-z0-9_]+", name)
    assert short_event_name(False, "/usr/lib/libssl.so.3", 0x10, 7).startswith("p_libssl_so_3_")
