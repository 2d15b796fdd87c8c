#!/usr/bin/env bash
# On-policy distillation with the real SmolLM2-135M-Instruct on CPU: first a teacher of our own making — the model
# trained by GRPO on arithmetic word problems (recipes/smollm2_word_problems_cpu.sh, its export: runs/smollm2_teacher,
# skipped when it is there) — then the untrained model learns from that teacher's per-token log-probs of its own
# samples, with no task reward (algorithm.distillation.task_weight=0). Extra arguments are overrides of the second run.
set -euo pipefail
cd "$(dirname "$0")/.."
TEACHER=runs/smollm2_teacher
if [ ! -f "$TEACHER/hf/config.json" ]; then
  recipes/smollm2_word_problems_cpu.sh trainer.default_local_dir="$TEACHER" trainer.export_at_end=true
fi
exec .venv/bin/hybridrl train --config-name grpo_smollm2_word_problems_cpu \
  trainer.default_local_dir=runs/smollm2_distill trainer.experiment_name=smollm2_distill_cpu \
  algorithm.distillation.teacher_path="$TEACHER/hf" algorithm.distillation.task_weight=0 "$@"
