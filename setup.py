"""The C extension and the BPF objects; everything else is in pyproject.toml.

A setup.py rather than [tool.setuptools] ext-modules because that table needs
setuptools >= 74.1 and is still marked experimental there, while Debian 12's
own setuptools (66) builds this file too.

The BPF objects (bpf/build/*.bpf.o) are built before the package's files are
collected, when the checkout has none yet: scripts/build_bpf.sh needs clang,
libbpf's headers and bpftool on the building host only. The wheel carries the
objects, so a host that installs it needs libbpf1 and nothing else.
"""

import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildWithBpfObjects(build_py):
    def run(self):
        if not (HERE / "bpf" / "build" / "sock.bpf.o").exists():
            subprocess.run(["bash", str(HERE / "scripts" / "build_bpf.sh")], check=True)
        super().run()


setup(
    cmdclass={"build_py": BuildWithBpfObjects},
    ext_modules=[
        Extension(
            "inferprobe.probes._usdt",
            sources=["probes/_usdt.c"],
            extra_compile_args=["-O2", "-std=gnu11"],
            # Without <sys/sdt.h> (systemtap-sdt-dev) the build is skipped with a
            # warning and inferprobe.probes.usdt runs as no-ops that say why
            # (usdt.available, usdt.reason): a missing tracer library must not
            # stop a server from installing.
            optional=True,
        )
    ],
)
