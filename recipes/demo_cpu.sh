#!/usr/bin/env bash
# The CPU demo: tiny model, SFT then GRPO on arithmetic (same as `make demo`). Extra arguments are GRPO overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/hybridrl demo "$@"
