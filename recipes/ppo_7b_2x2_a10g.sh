#!/usr/bin/env bash
# PPO (critic + GAE) on GSM8K: Qwen2.5-7B-Instruct, a DeBERTa-v3-large reward model of its own tokenizer, 2 nodes of
# 2 x A10G 24 GB over gigabit Ethernet. Start a Ray cluster over both nodes first (`ray start --head` on one,
# `ray start --address=<head>:6379` on the other) and run this on the head with trainer.ray.address=auto.
# The layout (rollout TP 2, HSDP within each node, parameter offload, checkpointing) is what
# `hybridrl plan --config-name ppo_qwen2.5_7b_2x2_a10g --no-check-paths --gpu a10g --network 1gbe` chose; its CPU
# twin (the same roles and layout, tiny models, a simulated 2-node Ray cluster) is tests/e2e/test_ppo_2x2_twin.py.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m hybridrl.data.preprocess gsm8k --input "${GSM8K_DIR:-../shared/data/gsm8k}" --output data/gsm8k
exec .venv/bin/hybridrl train --config-name ppo_qwen2.5_7b_2x2_a10g trainer.ray.address=auto "$@"
