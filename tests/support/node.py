"""Node.js for the tests that run a Node program, or the test is skipped saying why."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def node_binary() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node is not installed (Debian's nodejs; make setup installs it)")
    return node


# Where scripts/setup.sh installs the npm packages the tests use (NODE_PACKAGES_DIR there).
NODE_PACKAGES = Path(os.environ.get("NODE_PACKAGES_DIR", "/var/cache/inferprobe/node-packages"))


def node_package(name: str) -> str:
    """The NODE_PATH under which `name` is installed, or the test is skipped saying why."""
    modules = NODE_PACKAGES / "node_modules"
    if not (modules / name / "package.json").is_file():
        pytest.skip(f"the npm package {name} is not installed under {modules} (make setup installs it)")
    return str(modules)
