"""Only the C extension lives here; everything else is in pyproject.toml.

A setup.py rather than [tool.setuptools] ext-modules because that table needs
setuptools >= 74.1 and is still marked experimental there, while Debian 12's
own setuptools (66) builds this file too.
"""

from setuptools import Extension, setup

setup(
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
