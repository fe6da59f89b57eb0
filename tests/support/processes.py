"""Programs the tests start: `inferprobe` itself, the recorder, test servers; and stopping them."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.paths import SERVERS


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited within timeout seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_namespace_init(init_pid: int, unshare: subprocess.Popen, timeout: float = 15) -> None:
    """Stops a server that is pid 1 of its own pid namespace (its host pid), and the
    `unshare --fork` above it. unshare passes no signal on, so stopping it alone waited out
    stop_process's timeout before its SIGKILL; and pid 1 of a namespace gets only the signals
    it handles (pid_namespaces(7)): SIGTERM where it has a handler, else SIGKILL."""
    sigterm_caught = False
    try:
        for line in Path(f"/proc/{init_pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                sigterm_caught = bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
        os.kill(init_pid, signal.SIGTERM if sigterm_caught else signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass  # it has exited already
    try:
        unshare.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(unshare, timeout=0)


def answers_http(proc: subprocess.Popen, port: int, path: str, timeout_s: float, poll_s: float) -> bool:
    """Polls GET path on 127.0.0.1:port until it answers 200 (True), the process exits or
    timeout_s passes (False): how the engine tests wait for a server that loads a model."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(poll_s)
    return False


def inferprobe_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "inferprobe.cli.main", *args]


def report_json_text(recording: Path) -> str:
    """`inferprobe report RECORDING --format json`, as printed."""
    return subprocess.run(inferprobe_cmd("report", str(recording), "--format", "json"), capture_output=True,
                          text=True, check=True).stdout


def report_terminal_text(recording: Path) -> str:
    """`inferprobe report RECORDING`, the terminal report, as printed."""
    return subprocess.run(inferprobe_cmd("report", str(recording)), capture_output=True, text=True,
                          check=True).stdout


class ServerProcess:
    def __init__(self, log: Path, extra: list[str] | None = None):
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVERS / "sse_server.py"), "--host", "127.0.0.1",
             "--port", "0", "--log", str(log), *(extra or [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.proc.kill()
            raise RuntimeError(f"test server did not start: {line!r}")
        self.port = int(line.split(":")[-1])
        self.pid = self.proc.pid

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)


class ListeningProgram:
    """A test program that prints "LISTENING <port>" when ready and answers HTTP GETs."""

    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("LISTENING"):
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(line.split()[-1])
        self.pid = self.proc.pid

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, body

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Recorder:
    """`inferprobe record` as a subprocess; the constructor returns once it has attached."""

    def __init__(self, pids: list[int], output: Path, *extra: str):
        args = []
        for pid in pids:
            args += ["-p", str(pid)]
        self.output = output
        self.proc = subprocess.Popen(
            inferprobe_cmd("record", *args, "-o", str(output), *extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        spawned = time.monotonic()
        deadline = spawned + 60
        self.stdout_lines = []
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.stdout_lines.append(line)
            if line.startswith("inferprobe: attached"):
                self.attached_after_s = time.monotonic() - spawned  # the wait a user sees
                return
        err = self.proc.stderr.read()
        raise RuntimeError(f"recorder did not attach: {''.join(self.stdout_lines)} {err}")

    def wait_for_line(self, prefix: str, timeout: float = 30) -> str:
        """The recorder's next output line starting with prefix (a note such as
        "inferprobe: tls: attached ..."); every line read is kept for stop()."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.stdout_lines.append(line)
            if line.startswith(prefix):
                return line
        seen = "".join(self.stdout_lines)
        raise AssertionError(f"no line starting with {prefix!r} from the recorder: {seen}")

    def stop(self, timeout: float = 30) -> tuple[str, str]:
        """SIGTERM; (all of stdout, stderr) once it exited, SIGKILL after `timeout`.

        Not Popen.communicate(): with two pipes it reads their raw fds, and the
        lines that readline() in __init__ had already pulled into stdout's
        buffer with the "attached" line (the notes printed right after it)
        were lost whenever they arrived together."""
        self.proc.terminate()
        killed = threading.Event()
        watchdog = threading.Timer(timeout, lambda: (killed.set(), self.proc.kill()))
        watchdog.start()
        err: list[str] = []
        stderr_reader = threading.Thread(target=lambda: err.append(self.proc.stderr.read()), daemon=True)
        stderr_reader.start()
        try:
            out = self.proc.stdout.read()
            self.proc.wait()
            stderr_reader.join()
        finally:
            watchdog.cancel()
        if killed.is_set():
            raise subprocess.TimeoutExpired(self.proc.args, timeout)
        return "".join(self.stdout_lines) + out, "".join(err)


def record_client_run(command: list[str], recording: Path, env: dict[str, str] | None = None,
                      ready: str = "ready", timeout: float = 120) -> str:
    """Runs a client that prints `ready` and waits for a line on stdin, recorded from
    its own pid (a process with no listening socket needs no flag) while it runs; its
    stdout after `ready`. A client still running on the way out is killed."""
    client = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert client.stdout.readline().strip() == ready
        rec = Recorder([client.pid], recording, "--duration", str(int(timeout)))
        client.stdin.write("go\n")
        client.stdin.flush()
        out = client.stdout.read()
        assert client.wait(timeout=timeout) == 0
        rec.stop()
        return out
    finally:
        if client.poll() is None:
            client.kill()


# The start of the inline test servers run with python_script: the modules
# they use, a socket listening on a free loopback port, and that port printed
# as the first line of their output.
LISTENING_SERVER = r"""
import json, os, queue, socket, sys, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
"""

# Reads one request per recv() and answers it with the writes given for it, in
# the JSON file named by its argument: per request, a list of writes, each hex
# (one send) or a list of hex (one sendmsg, an iovec each). For tests that
# pin what the kernel makes of exact bytes.
SCRIPTED_SERVER = LISTENING_SERVER + r"""
steps = json.load(open(sys.argv[1]))
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for writes in steps:
    conn.recv(65536)
    for w in writes:
        if isinstance(w, list):
            conn.sendmsg([bytes.fromhex(part) for part in w])
        else:
            conn.sendall(bytes.fromhex(w))
        time.sleep(0.01)
conn.recv(1)
"""
