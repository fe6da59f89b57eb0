"""Go binary analysis against real Go programs built here with Debian's Go, checked three ways.

- Against the Go toolchain: the version `go version BINARY` reads, and the
  entry and RET lines of `go tool objdump` for crypto/tls.(*Conn).Read/Write.
- Against the process's own memory: the Go TLS echo server
  (tests/programs/go_tls_echo.go) prints each connection's *tls.Conn address
  and the fd it took from Go's own net package; following the offsets from
  that address through /proc/PID/mem must land on that fd.
- Against the kernel: uprobes at the entries and at every RET found, with
  the offsets in a small BPF program, must see the server's reads and writes
  with their lengths (RBX/RCX at the entry, RAX at a RET), the socket fd, and
  R14 holding a goroutine whose stack holds RSP.

A build stripped with -s -w (no symbol table, no DWARF) must give the same
addresses through Go's function table and the same offsets from the table.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from inferprobe.collector.binaries import go_struct_offsets
from inferprobe.collector.binaries.go_binary import (
    READ_SYMBOL,
    WRITE_SYMBOL,
    GoFunction,
    GoTlsProbes,
    go_binary_verdict,
    go_tls_targets,
)
from inferprobe.collector.binaries.go_buildinfo import parse_version
from inferprobe.collector.binaries.go_struct_offsets import (
    TYPES,
    structs_by_name,
    structs_by_walk,
    table_offsets,
)

from tests.support import clang_bpf
from tests.support.kernel import needs_root
from tests.support.paths import PROGRAMS, SERVERS
from tests.support.processes import stop_process

GO = shutil.which("go")
pytestmark = pytest.mark.skipif(GO is None,
                                reason="Go is not installed (Debian's golang-go; make setup installs it)")

MESSAGES = [b"a" * 100, b"b" * 1000, b"c" * 5000]  # lengths a miscount would show


@pytest.fixture(scope="module")
def go_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("gohome")
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "GOCACHE": str(home / "gocache")}


def go_build(env: dict[str, str], source: Path, out: Path, *flags: str) -> str:
    subprocess.run([GO, "build", *flags, "-o", str(out), str(source)], check=True, env=env)
    return str(out)


@pytest.fixture(scope="module")
def binaries(go_env, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("gobin")
    return {
        "echo": go_build(go_env, PROGRAMS / "go_tls_echo.go", out / "echo"),
        "echo_stripped": go_build(go_env, PROGRAMS / "go_tls_echo.go", out / "echo_stripped",
                                  "-ldflags=-s -w"),  # no symbol table, no DWARF
        "shapes": go_build(go_env, SERVERS / "stream_shapes.go", out / "shapes"),
    }


def probes_of(path: str) -> GoTlsProbes:
    verdict = go_binary_verdict(path)
    assert verdict is not None and verdict.probes is not None, verdict
    return verdict.probes


def objdump(env: dict[str, str], path: str, symbol: str) -> tuple[int, list[int]]:
    """(entry, RET addresses) of symbol as the Go toolchain's disassembler lists them."""
    pattern = "^" + re.escape(symbol) + "$"
    text = subprocess.run([GO, "tool", "objdump", "-s", pattern, path], check=True, env=env,
                          capture_output=True, text=True).stdout
    # "  conn.go:1308\t\t0x5977c4\t\tc3\t\t\tRET\t...": place, address, bytes, instruction
    rows = [re.split(r"\t+", line.strip()) for line in text.splitlines() if not line.startswith("TEXT")]
    addresses = [(int(cols[1], 16), cols[3].split()[0]) for cols in rows if len(cols) >= 4]
    assert text.count("TEXT ") == 1 and addresses, text[:500]
    return addresses[0][0], [a for a, mnemonic in addresses if mnemonic == "RET"]


@pytest.mark.parametrize("name", ["echo", "shapes"])
def test_version_is_the_one_go_reads(binaries, go_env, name) -> None:
    said = subprocess.run([GO, "version", binaries[name]], check=True, env=go_env, capture_output=True,
                          text=True).stdout  # "PATH: go1.19.8"
    assert probes_of(binaries[name]).go_version == said.rsplit(": ", 1)[1].strip()


@pytest.mark.parametrize("name", ["echo", "shapes"])
@pytest.mark.parametrize("symbol", [READ_SYMBOL, WRITE_SYMBOL])
def test_entry_and_returns_are_the_toolchain_disassembly(binaries, go_env, name, symbol) -> None:
    probes = probes_of(binaries[name])
    function: GoFunction = probes.read if symbol == READ_SYMBOL else probes.write
    entry, returns = objdump(go_env, binaries[name], symbol)
    assert function.address == entry
    assert list(function.returns) == returns
    with open(binaries[name], "rb") as f:  # the file offsets hold the same bytes objdump decoded
        f.seek(function.return_file_offsets[0])
        assert f.read(1) == b"\xc3"


def test_dwarf_offsets_agree_with_the_table(binaries) -> None:
    probes = probes_of(binaries["echo"])
    assert probes.offsets.source == "dwarf" and probes.symbols_from == "symtab"
    release = parse_version(probes.go_version)
    assert release is not None
    table = table_offsets(release.release)
    if table is None:
        pytest.skip(f"{probes.go_version} is not in the fallback table")
    assert [getattr(probes.offsets, f) for f in table.__dataclass_fields__ if f != "source"] == \
        [getattr(table, f) for f in table.__dataclass_fields__ if f != "source"]


@pytest.mark.parametrize("name", ["echo", "shapes"])
def test_structs_found_by_name_are_those_a_full_walk_finds(binaries, name) -> None:
    with open(binaries[name], "rb") as f:
        elf = ELFFile(f)
        by_name = structs_by_name(elf.get_dwarf_info())
        assert set(by_name) == TYPES
        assert by_name == structs_by_walk(elf.get_dwarf_info())


def test_stripped_build_gives_the_same_probes(binaries) -> None:
    full, stripped = probes_of(binaries["echo"]), probes_of(binaries["echo_stripped"])
    assert stripped.symbols_from == "pclntab" and stripped.offsets.source == "table"
    assert (stripped.read, stripped.write) == (full.read, full.write)
    assert [getattr(stripped.offsets, f) for f in ("tls_conn_conn", "iface_data", "pfd_sysfd")] == \
        [getattr(full.offsets, f) for f in ("tls_conn_conn", "iface_data", "pfd_sysfd")]


def test_refusals_say_what_to_do(binaries, go_env, tmp_path, monkeypatch) -> None:
    arm = go_build({**go_env, "GOARCH": "arm64"}, PROGRAMS / "go_tls_echo.go", tmp_path / "echo_arm64")
    verdict = go_binary_verdict(arm)
    assert verdict is not None and verdict.probes is None and "amd64" in (verdict.reason or "")

    # No DWARF, and a release the table does not hold (as a future Go would be)
    monkeypatch.setattr(go_struct_offsets, "FALLBACK_TABLE", {})
    verdict = go_binary_verdict(binaries["echo_stripped"])
    assert verdict is not None and verdict.probes is None and "without -ldflags=-w" in (verdict.reason or "")


def test_go_without_tls_gives_no_verdict(go_env, tmp_path) -> None:
    source = tmp_path / "plain.go"
    source.write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("no TLS here") }\n')
    assert go_binary_verdict(go_build(go_env, source, tmp_path / "plain")) is None


class EchoServer:
    def __init__(self, path: str):
        self.proc = subprocess.Popen([path], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("LISTENING"), line
        self.port = int(line.split()[1])
        self.pid = self.proc.pid

    def connect(self) -> tuple[ssl.SSLSocket, int, int]:
        """A TLS connection; (socket, the server's *tls.Conn address, its fd)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        sock = context.wrap_socket(socket.create_connection(("127.0.0.1", self.port)),
                                   server_hostname="localhost")
        line = self.proc.stdout.readline()  # "CONN 0xc000... FD 7", printed after the handshake
        _conn, pointer, _fd, fd = line.split()
        return sock, int(pointer, 16), int(fd)

    def stop(self) -> None:
        stop_process(self.proc)


def echo(sock: ssl.SSLSocket, message: bytes) -> None:
    sock.sendall(message)
    got = b""
    while len(got) < len(message):
        got += sock.recv(65536)
    assert got == message


def test_targets_of_a_running_server(binaries) -> None:
    server = EchoServer(binaries["echo"])
    try:
        targets = go_tls_targets(server.pid)
        assert [t.pid for t in targets] == [server.pid]
        assert targets[0].path == binaries["echo"] and os.path.exists(targets[0].host_path)
        found = targets[0].probes
        assert found is not None
        assert found == dataclasses.replace(probes_of(binaries["echo"]), path=found.path)  # any path to it
        assert go_tls_targets(server.pid)[0].verdict is targets[0].verdict  # analysed once
        assert go_tls_targets(os.getpid()) == []  # python: no Go
    finally:
        server.stop()


def read_word(mem, address: int) -> int:
    mem.seek(address)
    return int.from_bytes(mem.read(8), "little", signed=True)


@needs_root
def test_offsets_lead_from_a_tls_conn_to_its_fd_in_process_memory(binaries) -> None:
    for name in ("echo", "echo_stripped"):  # DWARF offsets, then the table's
        offsets = probes_of(binaries[name]).offsets
        server = EchoServer(binaries[name])
        try:
            sock, conn, fd = server.connect()
            echo(sock, b"hello")  # the connection is in use: its fields are set
            with open(f"/proc/{server.pid}/mem", "rb") as mem:
                tcp_conn = read_word(mem, conn + offsets.tls_conn_conn + offsets.iface_data)
                net_fd = read_word(mem, tcp_conn + offsets.tcp_conn_conn + offsets.conn_fd)
                assert read_word(mem, net_fd + offsets.netfd_pfd + offsets.pfd_sysfd) == fd
            assert os.readlink(f"/proc/{server.pid}/fd/{fd}").startswith("socket:[")
            sock.close()
        finally:
            server.stop()


GO_CALLS = r"""
struct record {
    u32 kind;         // 1 Read entry, 2 Write entry, 3 Read RET, 4 Write RET
    u32 sp_on_stack;  // RSP within the stack of the goroutine R14 points at
    u64 goroutine;    // R14
    s64 value;        // entry: the []byte's length (RCX); RET: n (RAX)
    s64 fd;           // entry: the socket fd the offsets lead to from RAX
};
%RECORDS%

static __always_inline s64 conn_fd(u64 conn) {
    u64 tcp_conn = 0, net_fd = 0;
    s64 fd = -1;
    bpf_probe_read_user(&tcp_conn, 8, (void *)(conn + TLS_CONN_CONN + IFACE_DATA));
    bpf_probe_read_user(&net_fd, 8, (void *)(tcp_conn + TCP_CONN_CONN + CONN_FD));
    bpf_probe_read_user(&fd, 8, (void *)(net_fd + NETFD_PFD + PFD_SYSFD));
    return fd;
}

static __always_inline int emit(struct pt_regs *ctx, u32 kind) {
    struct record *c = next_record();
    u64 stack[2] = {};  // runtime.g opens with its stack bounds, lo and hi
    if (!c)
        return 0;
    c->kind = kind;
    c->goroutine = ctx->r14;
    bpf_probe_read_user(stack, sizeof(stack), (void *)ctx->r14);
    c->sp_on_stack = stack[0] <= ctx->sp && ctx->sp < stack[1];
    if (kind <= 2) {
        c->value = ctx->cx;
        c->fd = conn_fd(ctx->ax);
    } else {
        c->value = ctx->ax;
        c->fd = -1;
    }
    return 0;
}

SEC("uprobe") int read_entry(struct pt_regs *ctx) { return emit(ctx, 1); }
SEC("uprobe") int write_entry(struct pt_regs *ctx) { return emit(ctx, 2); }
SEC("uprobe") int read_return(struct pt_regs *ctx) { return emit(ctx, 3); }
SEC("uprobe") int write_return(struct pt_regs *ctx) { return emit(ctx, 4); }
"""


@needs_root
@pytest.mark.bpf
def test_uprobes_at_the_entries_and_returns_see_the_calls(binaries, tmp_path) -> None:
    probes = probes_of(binaries["echo"])
    o = probes.offsets
    flags = tuple(f"-D{k.upper()}={getattr(o, k)}" for k in
                  ("tls_conn_conn", "iface_data", "tcp_conn_conn", "conn_fd", "netfd_pfd", "pfd_sysfd"))
    # A tracer of the test's own (tests/support/clang_bpf.py), not inferprobe's TLS set.
    bpf = clang_bpf.build(GO_CALLS, tmp_path, "go_calls", flags)
    server = EchoServer(binaries["echo"])
    try:
        bpf.load()
        path = str(probes.path)
        for function, entry_fn, return_fn in ((probes.read, "read_entry", "read_return"),
                                              (probes.write, "write_entry", "write_return")):
            bpf.attach_uprobe(entry_fn, server.pid, path, function.file_offset)
            for ret in function.return_file_offsets:
                bpf.attach_uprobe(return_fn, server.pid, path, ret)
        sock, _conn, fd = server.connect()
        for message in MESSAGES:
            echo(sock, message)
        sock.close()
        deadline = time.monotonic() + 5
        calls: list[tuple[int, int, int, int, int]] = []
        while time.monotonic() < deadline and not any(c[0] == 3 and c[2] == 0 for c in calls):
            time.sleep(0.05)  # until the Read that returns 0 at the close
            calls = [(c.kind, c.goroutine, c.value, c.fd, c.sp_on_stack) for c in clang_bpf.read_records(bpf)]
    finally:
        bpf.close()
        server.stop()
    lengths = [len(m) for m in MESSAGES]
    assert [v for k, _g, v, _fd, _s in calls if k == 3 and v > 0] == lengths  # n in RAX at a RET of Read
    assert [v for k, _g, v, _fd, _s in calls if k == 2] == lengths  # RCX at Write's entry
    assert [v for k, _g, v, _fd, _s in calls if k == 4] == lengths  # n in RAX at a RET of Write
    assert {f for k, _g, _v, f, _s in calls if k in (1, 2)} == {fd}  # the offsets reach the socket
    assert all(s for *_rest, s in calls), calls  # R14 is the goroutine, at entries and returns alike
    assert len({g for _k, g, *_rest in calls}) == 1  # one connection, one goroutine (serve)


def test_stream_shapes_tls_mode_serves_http1_over_tls(binaries, tmp_path) -> None:
    """The Go stream-shapes server's HTTPS mode: found by go_tls_targets, and HTTP/1.1 even to
    a client offering h2 first (the e2e TLS tests read HTTP/1.1 framing)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed: no certificate to serve")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    env = {"PATH": "/usr/bin:/bin", "STREAM_SHAPES_TLS_CERT": str(cert), "STREAM_SHAPES_TLS_KEY": str(key)}
    proc = subprocess.Popen([binaries["shapes"], str(SERVERS / "stream_shapes_payloads.json"),
                             str(tmp_path / "log")], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(proc.stdout.readline())
        assert [t.probes is not None for t in go_tls_targets(proc.pid)] == [True]
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False
        context.set_alpn_protocols(["h2", "http/1.1"])
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost") \
                as sock:
            assert sock.selected_alpn_protocol() == "http/1.1"
            body = b'{"model": "m", "prompt": "p", "tokens": 3, "interval_ms": 0}'
            sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
            response = b""
            while chunk := sock.recv(65536):
                response += chunk
        assert response.startswith(b"HTTP/1.1 200 OK\r\n")
        assert response.count(b'"done":false') == 3 and b'"done":true' in response
    finally:
        stop_process(proc)
