"""rustls in a file that keeps its symbols: its two plaintext functions found by their
mangled names, and how the file's rustc returns their Result, told from their code.

The code bytes are the first instructions of rustls 0.20.8's <Reader as io::Read>::read
and <Writer as io::Write>::write in tests/programs/rustls_sse's server, built once with
Debian's rustc 1.63 (the Result through a hidden first argument) and once with
rustc-web 1.96 (the Result in RAX:RDX); both builds were recorded end to end
(tests/integration/e2e/test_tls.py runs the one make setup installs)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from inferprobe.collector.binaries.elf_symbols import has_symtab
from inferprobe.collector.binaries.tls_libraries import (
    _RUSTLS_PATTERN,
    RUSTLS_READ,
    RUSTLS_WRITE,
    TlsLibrary,
    rustls_abi,
)

RUSTC_1_63 = {
    RUSTLS_READ: bytes.fromhex("554157415641554154534883ec184885c90f84b40000004989cd4989d448897c2410"
                               "4889742408488b1e4531f64c8b3d9c331900eb23662e0f1f840000000000"),
    RUSTLS_WRITE: bytes.fromhex("534889fb488b064c8b46084889c641ff50184889d85bc3"),
}
RUSTC_1_96 = {
    RUSTLS_READ: bytes.fromhex("55415741564155415453504989d631ed4885d20f849b0000004c8b2749837c242800"
                               "0f848c0000004989f748893c2431ed488b1db0790e000f1f840000000000"),
    RUSTLS_WRITE: bytes.fromhex("488b07488b4f08488b49184889c7ffe1"),
}


def test_an_older_rustc_returns_the_result_through_a_hidden_pointer():
    assert rustls_abi(RUSTC_1_63[RUSTLS_READ], RUSTC_1_63[RUSTLS_WRITE]) == "hidden-pointer"


def test_a_current_rustc_returns_it_in_registers():
    assert rustls_abi(RUSTC_1_96[RUSTLS_READ], RUSTC_1_96[RUSTLS_WRITE]) == "registers"


def test_functions_that_disagree_or_show_no_receiver_load_are_not_hooked():
    assert rustls_abi(RUSTC_1_63[RUSTLS_READ], RUSTC_1_96[RUSTLS_WRITE]) is None
    assert rustls_abi(b"\x55\xc3", RUSTC_1_96[RUSTLS_WRITE]) is None


@pytest.mark.parametrize("name", [
    # rustls 0.20/0.21: rustls::conn::Reader
    "_ZN54_$LT$rustls..conn..Reader$u20$as$u20$std..io..Read$GT$4read17hb9050202f42b83c3E",
    "_ZN55_$LT$rustls..conn..Writer$u20$as$u20$std..io..Write$GT$5write17h0b4113021e5703a4E",
    # rustls 0.22 and later: rustls::conn::connection::Reader
    "_ZN66_$LT$rustls..conn..connection..Reader$u20$as$u20$std..io..Read$GT$4read17h0123456789abcdefE",
    "_ZN67_$LT$rustls..conn..connection..Writer$u20$as$u20$std..io..Write$GT$5write17hfedcba9876543210E",
])
def test_both_functions_are_found_in_every_rustls_layout(name):
    assert re.search(_RUSTLS_PATTERN, name)


@pytest.mark.parametrize("name", [
    "_ZN6rustls4msgs5codec6Reader3sub17h1234567890abcdefE",   # rustls's own message Reader
    "_ZN55_$LT$rustls..conn..Writer$u20$as$u20$std..io..Write$GT$5flush17h0b4113021e5703a4E",
    # tokio-rustls's Writer over the socket carries ciphertext
    "_ZN102_$LT$tokio_rustls..common..Stream$LT$IO$C$C$GT$..write_io..Writer$LT$T$GT$$u20$as$u20$std..io.."
    "Write$GT$5write17h1234567890abcdefE",
])
def test_other_readers_and_writers_are_not(name):
    assert not re.search(_RUSTLS_PATTERN, name)


def test_each_function_gets_the_programs_of_its_abi():
    functions = {RUSTLS_READ: 0x1000, RUSTLS_WRITE: 0x2000}
    older = TlsLibrary(pid=1, path="/srv", kind="rustls", file_key=(1, 2), functions=functions,
                       abi="hidden-pointer")
    assert older.hookable
    assert older.probe_programs() == [
        (RUSTLS_READ, 0x1000, "tls_rustls_read_enter_sret", "tls_rustls_return"),
        (RUSTLS_WRITE, 0x2000, "tls_rustls_write_enter_sret", "tls_rustls_return")]
    current = TlsLibrary(pid=1, path="/srv", kind="rustls", file_key=(1, 2), functions=functions,
                         abi="registers")
    assert [entry for _, _, entry, _ in current.probe_programs()] == ["tls_rustls_read_enter",
                                                                      "tls_rustls_write_enter"]
    unknown = TlsLibrary(pid=1, path="/srv", kind="rustls", file_key=(1, 2), functions=functions)
    assert not unknown.hookable


def test_a_stripped_file_is_told_by_its_section_headers(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("strip") is None:
        pytest.skip("no C compiler or strip on this host")
    source = tmp_path / "main.c"
    source.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "main"
    subprocess.run([cc, "-o", str(exe), str(source)], check=True)
    assert has_symtab(str(exe))
    subprocess.run(["strip", str(exe)], check=True)
    assert not has_symtab(str(exe))
    assert not has_symtab(str(source))   # not ELF
