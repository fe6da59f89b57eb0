"""Which llama.cpp API a file exports, and where llama_batch_allocr keeps its batch
(collector/binaries/llama_api.py)."""

from __future__ import annotations

import pytest

from inferprobe.collector.binaries import llama_api
from inferprobe.collector.binaries.llama_api import DECODE, GET_BATCH, PROCESS, member_offset_of_getter

# 11434's llama_batch_allocr::init(const llama_batch_ext &, const llama_vocab &, bool)
ALLOCR_INIT = "_ZN18llama_batch_allocr4initERK15llama_batch_extRK11llama_vocabb"


@pytest.mark.parametrize(("code", "offset"), [
    ("4889f8c3", 0),                    # mov rax, rdi; ret: what llama.cpp 10930 and 11434 compile
    ("f30f1efa488d4718c3", 24),         # endbr64; lea rax, [rdi + 0x18]; ret
    ("488d87a0010000c3", 0x1A0),        # lea rax, [rdi + 0x1a0]; ret
    # -O0: push rbp; mov rbp, rsp; mov [rbp-8], rdi; mov rax, [rbp-8]; pop rbp; ret
    ("554889e548897df8488b45f85dc3", None),
    ("488d4608c3", None),               # lea rax, [rsi + 8]: not this object's member
    ("488b07c3", None),                 # mov rax, [rdi]: a pointer loaded, not the member's address
    ("4889f8", None),                   # no ret
])
def test_the_member_offset_comes_from_the_getters_code_or_not_at_all(code, offset):
    assert member_offset_of_getter(bytes.fromhex(code)) == offset


def _exports(monkeypatch, names, getter_code="4889f8c3"):
    addresses = {name: 0x1000 + i for i, name in enumerate(names)}
    monkeypatch.setattr(llama_api, "exported_functions", lambda path: addresses)
    monkeypatch.setattr(llama_api, "code_at", lambda path, vaddr, size: bytes.fromhex(getter_code))


def test_llama_process_with_its_allocator_is_read_and_llama_decode_goes_with_it(monkeypatch):
    _exports(monkeypatch, [DECODE, PROCESS, ALLOCR_INIT, GET_BATCH])
    api = llama_api.find_api("libllama.so")
    assert api is not None and api.kind == PROCESS and api.batch_offset == 0 and api.refusal is None
    assert api.step_functions == [PROCESS, DECODE] and api.init_functions == [ALLOCR_INIT]


def test_only_llama_decode_is_the_old_api(monkeypatch):
    # 10930 also exports get_batch() and an init(const llama_batch &, ...): llama_decode is read by value
    old_init = "_ZN18llama_batch_allocr4initERK11llama_batchRK11llama_vocabPK14llama_memory_ijjb"
    _exports(monkeypatch, [DECODE, GET_BATCH, old_init])
    api = llama_api.find_api("libllama.so")
    assert api is not None and api.kind == DECODE and api.step_functions == [DECODE]


def test_llama_process_without_the_allocator_or_with_unknown_code_is_refused_in_a_sentence(monkeypatch):
    _exports(monkeypatch, [PROCESS, GET_BATCH])
    api = llama_api.find_api("/x/libllama.so")
    assert api is not None and api.refusal is not None and "llama_batch_allocr::init" in api.refusal
    _exports(monkeypatch, [PROCESS, ALLOCR_INIT, GET_BATCH], getter_code="554889e548897df8488b45f85dc3")
    api = llama_api.find_api("/x/libllama.so")
    assert api is not None and api.batch_offset is None
    assert api.refusal is not None and api.refusal.startswith("cannot confirm where llama_batch_allocr keeps")


def test_a_file_without_either_is_no_llama(monkeypatch):
    _exports(monkeypatch, ["llama_synchronize"])
    assert llama_api.find_api("libfoo.so") is None
