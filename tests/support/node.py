"""Node.js for the tests that run a Node program, or the test is skipped saying why."""

from __future__ import annotations

import shutil

import pytest


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node is not installed (Debian's nodejs; make setup installs it)")
    return node
