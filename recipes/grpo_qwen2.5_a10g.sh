#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2.5-0.5B-Instruct on one A10G (24 GB). Put the model at models/Qwen2.5-0.5B-Instruct
# (or pass model.path=...). Memory: `hybridrl plan --config-name grpo_qwen2.5_0.5b_a10g --no-check-paths --gpu a10g`
# -> peak 18.4 GiB of 22.5 (18 % headroom) at 6144 tokens per micro-batch.
# For 1.5B: model.path=models/Qwen2.5-1.5B-Instruct actor.ppo_max_token_len_per_gpu=4096
# rollout.gpu_memory_utilization=0.3 actor.fsdp.param_offload=true (plan: peak 13.5 GiB; the update runs on the host).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m hybridrl.data.preprocess gsm8k --input "${GSM8K_DIR:-../shared/data/gsm8k}" --output data/gsm8k
exec .venv/bin/hybridrl train --config-name grpo_qwen2.5_0.5b_a10g "$@"
