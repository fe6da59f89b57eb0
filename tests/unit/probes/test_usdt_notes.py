"""Contract: the probes in the built extension, the C/C++ header and the stubs
are exactly the table in inferprobe.probes (names, argument count, argument
names and order where the file states them). Needs no root.

Argument *order* cannot be read from a note (it holds only sizes and
locations): test_usdt_bpf.py fires every probe with distinct values for that.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from inferprobe.probes import PROBES, PROVIDER, include_dir, usdt

from tests.programs.usdt_trace import build_c_child, stapsdt_notes

PROBES_DIR = Path(usdt.__file__).resolve().parent
TABLE = {p.name: len(p.args) for p in PROBES}


def extension_path() -> Path:
    assert usdt.available, f"the C extension must be built for these tests: {usdt.reason}"
    from inferprobe.probes import _usdt

    return Path(_usdt.__file__)


def check_notes(path: Path, *, once: bool) -> None:
    notes, probes_span = stapsdt_notes(path)
    assert notes, f"{path} has no .note.stapsdt"
    by_name = defaultdict(list)
    for note in notes:
        assert note.provider == PROVIDER, note
        by_name[note.name].append(note)
    assert sorted(by_name) == sorted(TABLE), f"{path}: probes differ from inferprobe.probes.PROBES"
    assert probes_span is not None, f"{path} has no .probes section for the semaphores"
    semaphores = {}
    for name, sites in by_name.items():
        if once:
            assert len(sites) == 1, f"{name} has {len(sites)} sites in {path}"
        for note in sites:
            assert len(note.args) == TABLE[name], f"{name}: {note.args}"
            # -8@...: every argument is a signed 64-bit value.
            assert all(a.startswith("-8@") for a in note.args), f"{name}: {note.args}"
            # A zero semaphore address means an unguarded probe.
            assert probes_span[0] <= note.semaphore < probes_span[1], f"{name}: semaphore outside .probes"
            assert semaphores.setdefault(name, note.semaphore) == note.semaphore
    assert len(set(semaphores.values())) == len(TABLE), "two probes share a semaphore"


def test_extension_notes_match_the_table():
    check_notes(extension_path(), once=True)


def test_extension_reports_the_table_it_was_built_with():
    from inferprobe.probes import _usdt

    assert _usdt.PROBES == tuple((p.name, len(p.args)) for p in PROBES)


@pytest.mark.parametrize("language", ["c", "c++"])
def test_header_program_notes_match_the_table(tmp_path, language):
    # request_start fires at two sites in fire_probes.c, hence once=False.
    check_notes(build_c_child(tmp_path, language), once=False)


def test_header_macros_match_the_table():
    text = (include_dir() / "inferprobe" / "usdt.h").read_text()
    macros = dict(re.findall(r"^#define INFERPROBE_([A-Z_0-9]+)\(([^)]*)\)", text, re.M))
    for p in PROBES:
        params = macros.get(p.name.upper())
        assert params is not None, f"usdt.h has no INFERPROBE_{p.name.upper()}"
        assert tuple(a.strip() for a in params.split(",")) == p.args, p.name
    probe_macros = {m for m in macros if not m.endswith("ENABLED") and not m.startswith("_")}
    assert probe_macros == {p.name.upper() for p in PROBES}


@pytest.mark.parametrize("stub", ["_usdt.pyi", "usdt.pyi"])
def test_stubs_match_the_table(stub):
    tree = ast.parse((PROBES_DIR / stub).read_text())
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for p in PROBES:
        f = functions.get(p.name)
        assert f is not None, f"{stub} lacks {p.name}"
        # Positional-only, like the METH_FASTCALL functions they describe.
        assert tuple(a.arg for a in f.args.posonlyargs) == p.args, p.name
        assert not f.args.args and not f.args.kwonlyargs and f.args.vararg is None, p.name
