"""Type-check the package as it is imported: inferprobe.collector, not collector.

pyproject.toml maps each top-level folder onto a subpackage of the namespace
package "inferprobe" ([tool.setuptools.package-dir]); the editable install makes
that mapping with an import hook, which mypy does not run. So this script links
each folder into build/typecheck/inferprobe/ (the mypy_path of [tool.mypy]), runs
mypy with the rest of its configuration, and prints its report with the folders'
own paths, so that an error's file:line opens the file you edit.

Usage: python scripts/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK_TREE = Path("build/typecheck")


def package_folders(pyproject: Path) -> dict[str, str]:
    """Subpackage name under inferprobe -> the folder it is built from."""
    config = tomllib.loads(pyproject.read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {name.removeprefix("inferprobe."): folder for name, folder in mapping.items()}


def link_folders(folders: dict[str, str]) -> Path:
    package = ROOT / LINK_TREE / "inferprobe"
    package.mkdir(parents=True, exist_ok=True)
    for name, folder in folders.items():
        link = package / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(ROOT / folder, target_is_directory=True)
    return package


def main(argv: list[str]) -> int:
    folders = package_folders(ROOT / "pyproject.toml")
    link_folders(folders)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *argv], cwd=ROOT, capture_output=True, text=True
    )
    prefix = f"{LINK_TREE}/inferprobe/"
    for name, folder in folders.items():
        result.stdout = result.stdout.replace(f"{prefix}{name}/", f"{folder}/")
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
