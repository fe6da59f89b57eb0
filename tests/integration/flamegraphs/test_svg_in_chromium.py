"""The SVG in a real browser: headless Debian chromium draws the frames and
its script runs without errors."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from inferprobe.flamegraphs import svg

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]

pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium is not installed (scripts/setup.sh installs it)")


def _chromium(tmp_path, profile_dir: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / profile_dir}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def graph(tmp_path):
    stacks = {("app (1)", "main", "serve", f"handler_{i}", "tcp_sendmsg_[k]"): 50 + 30 * i for i in range(6)}
    stacks[("app (1)", "main", "py::decode:/srv/app.py")] = 400
    stacks[("app (1)", "[truncated]", "memcpy")] = 80
    path = tmp_path / "graph.svg"
    path.write_text(svg.render(stacks, "browser test", "six handlers"))
    return path


def test_screenshot_shows_the_frames(tmp_path, graph):
    from PIL import Image

    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, "p1", "--window-size=1200,300", f"--screenshot={shot}", graph.as_uri())
    assert shot.exists(), run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 24)  # [(count, (r, g, b))]
    total = image.width * image.height
    blank = sum(n for n, rgb in colours if rgb in ((0xFC, 0xFC, 0xF8), (255, 255, 255)))
    assert (total - blank) / total > 0.10, "the screenshot is (nearly) blank"
    assert len(colours) > 20, "too few colours for coloured frames and text"
    assert "Uncaught" not in run.stderr, run.stderr[-2000:]


def test_script_initialises_without_errors(tmp_path, graph):
    run = _chromium(tmp_path, "p2", "--dump-dom", graph.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    # ipInit() sets data-ready as its last statement: any exception before it leaves it unset
    assert 'data-ready="1"' in run.stdout
    assert "Uncaught" not in run.stderr and "SyntaxError" not in run.stderr, run.stderr[-2000:]
