"""The reward and prompt file of ``smollm2_learns.py`` for TRL's side: the very scorer hybridrl routes
``arithmetic_word_problems`` to (:mod:`hybridrl.rewards.gsm8k`, pure Python), loaded from this checkout by path, so
both sides are paid by the same code. TRL's runner (``vs_trl_trl.py``, in ``.venv-trl``) imports it by path."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's hybridrl (its rewards need no torch)

from hybridrl.rewards.gsm8k import compute_score as _gsm8k_score  # noqa: E402


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """The GSM8K-style score hybridrl gives the response (1 right with ``####``, 0.5 right without, else 0)."""
    return _gsm8k_score(data_source, solution_str, ground_truth, extra_info)["score"]


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
