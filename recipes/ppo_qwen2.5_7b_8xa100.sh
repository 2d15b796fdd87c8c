#!/usr/bin/env bash
# PPO (critic + GAE) on GSM8K with Qwen2.5-7B-Instruct on one node of 8 × A100-80GB.
# Memory: `hybridrl plan --config-name ppo_qwen2.5_7b_8xa100 --no-check-paths --gpu a100-80` -> peak 64.6 GiB of 80
# (19 % headroom) thanks to actor/critic fsdp.grad_sync=micro_batch (sharded gradients while accumulating) and
# token-budget micro-batches (20k tokens actor, 32k critic) with activation checkpointing; see the config's header.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m hybridrl.data.preprocess gsm8k --input "${GSM8K_DIR:-../shared/data/gsm8k}" --output data/gsm8k
exec .venv/bin/hybridrl train --config-name ppo_qwen2.5_7b_8xa100 "$@"
