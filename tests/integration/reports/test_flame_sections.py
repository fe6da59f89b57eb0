"""Flame graph sections in the report, from a real --profile --offcpu recording.

burn.c burns CPU in burn_a/burn_b/burn_c; sleeper.c sleeps in wait_for_batch.
One recording of both (module scope); the reports come from the real CLI.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess

import pytest

from tests.programs.build import Program, build
from tests.support.kernel import needs_root
from tests.support.processes import Recorder, inferprobe_cmd

pytestmark = [needs_root, pytest.mark.bpf]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0")
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def flame(tmp_path_factory):
    if platform.machine() != "x86_64":
        pytest.skip("sleeper.c makes its syscall in x86-64 assembly")
    tmp = tmp_path_factory.mktemp("flame")
    burn = Program(build("burn", tmp), "--hold")
    sleeper = Program(build("sleeper", tmp))
    try:
        recording = tmp / "run.ipr"
        rec = Recorder([burn.pid, sleeper.pid], recording, "--no-listen-check", "--no-usdt",
                       "--no-gpu", "-d", "2", "--profile", "--offcpu")
        burn.go()  # held until now: its four threads would slow the recorder's compile three-fold
        rec.proc.wait(timeout=60)
        assert rec.proc.returncode == 0, rec.proc.stderr.read()
    finally:
        burn.stop()
        sleeper.stop()
    html_path = tmp / "report.html"
    subprocess.run(inferprobe_cmd("report", str(recording), "-o", str(html_path)), check=True)
    md = subprocess.run(inferprobe_cmd("report", str(recording), "--format", "md"), check=True,
                        capture_output=True, text=True).stdout
    text = subprocess.run(inferprobe_cmd("report", str(recording)), check=True, capture_output=True,
                          text=True).stdout
    return {"tmp": tmp, "html_path": html_path, "html": html_path.read_text(), "md": md, "text": text}


def _section(html: str, anchor: str):
    import lxml.html

    found = lxml.html.document_fromstring(html).get_element_by_id(anchor, None)
    assert found is not None, f"section {anchor} missing"
    return found


def _frame_names(section) -> set[str]:
    svgs = section.xpath(".//*[local-name()='svg']")
    assert len(svgs) == 1, "expected one inline <svg> flame graph"
    return {g.get("data-name") for g in svgs[0].iter() if g.get("class") == "f"}


def test_html_embeds_both_graphs_with_the_programs_functions(flame):
    cpu = _section(flame["html"], "analyzer-flame-cpu")
    off = _section(flame["html"], "analyzer-flame-offcpu")
    assert "On-CPU flame graph" in cpu.text_content()
    assert "Off-CPU flame graph" in off.text_content()
    assert {"burn_a", "burn_b"} <= _frame_names(cpu)
    assert "wait_for_batch" in _frame_names(off)
    # capture facts and probe set states, as tables and the sources list
    facts = cpu.text_content()
    for word in ("sampling rate", "samples", "stack map collisions", "user stacks not readable",
                 "Python frames, burn"):
        assert word in facts, word
    assert re.search(r"samples\s*[\d,]+", facts)
    assert cpu.xpath(".//ul[@class='sources']/li[@class='on']/b[text()='profile']")
    assert off.xpath(".//ul[@class='sources']/li[@class='on']/b[text()='offcpu']")
    # the cap is stated
    assert "narrower than" in cpu.text_content() or "every frame drawn" in cpu.text_content()


def test_html_is_self_contained(flame):
    import lxml.html

    html = flame["html"]
    assert not re.search(r"https?://|url\(\s*['\"]?(?!#)|@import|<link", html)
    for el in lxml.html.document_fromstring(html).iter():
        for name, value in el.attrib.items():
            if name.endswith("href") or name in ("src", "srcset", "action", "data", "poster"):
                assert value.startswith("#"), f"<{el.tag} {name}={value!r}> leaves the file"
    assert "<?xml" not in html


def test_markdown_and_terminal_list_top_frames_instead_of_the_picture(flame):
    for text in (flame["md"], flame["text"]):
        assert "On-CPU flame graph" in text and "Off-CPU flame graph" in text
        assert "Top 10 frames by self samples" in text
        assert "burn_a" in text and "wait_for_batch" in text
        assert "<svg" not in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup.sh installs it)")
def test_chromium_draws_the_graphs_and_their_scripts_run(flame):
    from PIL import Image

    tmp = flame["tmp"]
    dom = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'p1'}", "--dump-dom",
                          flame["html_path"].as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    # each graph's script ran to its last statement, inline, once per graph
    assert dom.stdout.count('data-ready="1"') == 2, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    # a tall window holds the whole page; the frames' own fill colours must cover part of it
    shot = tmp / "shot.png"
    run = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp / 'p2'}",
                          "--window-size=1300,5000", f"--screenshot={shot}", flame["html_path"].as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists(), run.stderr[-2000:]
    fills = set()
    for anchor in ("analyzer-flame-cpu", "analyzer-flame-offcpu"):
        for rect in _section(flame["html"], anchor).xpath(".//*[@class='f']/*[local-name()='rect']"):
            fill = rect.get("fill").lstrip("#")
            fills.add(tuple(int(fill[i:i + 2], 16) for i in (0, 2, 4)))
    image = Image.open(shot).convert("RGB")
    drawn = sum(n for n, rgb in image.getcolors(maxcolors=1 << 24) if rgb in fills)
    # two graphs of about 1000 x 100 px or more, mostly frame fills
    assert drawn > 50_000, f"only {drawn} pixels in flame frame colours: the graphs were not drawn"
