"""A certificate for the tests' HTTPS servers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed_certificate(directory: Path) -> dict[str, str]:
    """A key and certificate for 127.0.0.1, made now with the openssl tool, as the
    environment the stream-shape servers read (STREAM_SHAPES_TLS_CERT, _KEY)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed (Debian's openssl package)")
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return {"STREAM_SHAPES_TLS_CERT": str(cert), "STREAM_SHAPES_TLS_KEY": str(key)}
