"""collector/model/layout_generated.py is what scripts/gen_layout.py makes of bpf/inferprobe.h today.

Regenerates the module from the header (host C compiler + pyelftools, no
root) and compares it with the committed one, so a struct field, an enum
value or a #define changed in C alone fails here until the module is
regenerated. Skips, saying so, on a host without a C compiler.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

GENERATOR = REPO / "scripts" / "gen_layout.py"
COMMITTED = REPO / "collector" / "model" / "layout_generated.py"
HEADER = REPO / "bpf" / "inferprobe.h"

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")),
    reason="no C compiler on this host: the layout cannot be regenerated from bpf/inferprobe.h")


def _generate(out: Path, header: Path = HEADER) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), "--header", str(header), "-o", str(out)],
                          capture_output=True, text=True)


def test_the_committed_module_is_the_generated_one(tmp_path):
    result = _generate(tmp_path / "layout_generated.py")
    assert result.returncode == 0, result.stderr
    fresh = (tmp_path / "layout_generated.py").read_text()
    committed = COMMITTED.read_text()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                        "committed", "generated from bpf/inferprobe.h"))
    assert not diff, f"run `python scripts/gen_layout.py` and commit the result:\n{diff}"


def _edited_header(tmp_path: Path, old: str, new: str) -> Path:
    text = HEADER.read_text()
    assert text.count(old) == 1
    header = tmp_path / "inferprobe.h"
    header.write_text(text.replace(old, new))
    return header


def test_a_value_added_in_c_alone_reaches_the_python_enum(tmp_path):
    header = _edited_header(tmp_path, "    EVENT_USDT = 5,", "    EVENT_USDT = 5,\n    EVENT_TLS_DATA = 6,")
    assert _generate(tmp_path / "out.py", header).returncode == 0
    namespace: dict = {}
    exec((tmp_path / "out.py").read_text(), namespace)  # noqa: S102 - the generator's own output
    assert namespace["EventType"].TLS_DATA == 6


def test_implicit_padding_is_refused_with_the_field_named(tmp_path):
    # The header's rule is explicit padding: a u16 before an s32 leaves a hole
    # that the BPF side would never write.
    header = _edited_header(tmp_path, "    __s32 state;              /* TCP state (1 established) */",
                            "    __u16 state;")
    result = _generate(tmp_path / "out.py", header)
    assert result.returncode == 1
    assert "net_retransmit_event.err: 2 bytes of implicit padding before it" in result.stderr
    assert not (tmp_path / "out.py").exists()
