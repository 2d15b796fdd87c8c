#!/usr/bin/env bash
# An LLM judge as the only reward, on CPU, after `make demo`: fine-tune the demo's GRPO checkpoint into a judge of
# the demo task's answers (runs/demo/judge/hf; skipped when it is there), then GRPO the demo's SFT checkpoint on the
# judge's verdicts alone, the judge served by hybridrl in a process of its own. Extra arguments are GRPO overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
for checkpoint in runs/demo/sft/hf runs/demo/grpo/hf; do
  [[ -f "$checkpoint/config.json" ]] || { echo "$checkpoint is missing: run make demo first" >&2; exit 2; }
done
[[ -f runs/demo/judge/hf/config.json ]] || .venv/bin/hybridrl sft --config-name demo_judge_sft
# the judge's own held-out verdicts, against the exact answers
.venv/bin/hybridrl eval runs/demo/judge --overwrite
exec .venv/bin/hybridrl train --config-name demo_judge "$@"
