#!/usr/bin/env bash
# On-policy distillation on CPU, after `make demo`: the demo's SFT checkpoint (the student) learns from its GRPO
# checkpoint (the teacher) by the teacher's per-token log-probs of the student's own samples, no task reward.
# Extra arguments are overrides (e.g. algorithm.distillation.task_weight=0.5 mixes the task reward back in).
set -euo pipefail
cd "$(dirname "$0")/.."
for checkpoint in runs/demo/sft/hf runs/demo/grpo/hf; do
  [[ -f "$checkpoint/config.json" ]] || { echo "$checkpoint is missing: run make demo first" >&2; exit 2; }
done
exec .venv/bin/hybridrl train --config-name demo_distill "$@"
