"""The task both sides of ``vs_trl.py`` train on: addition problems and one reward function, shared by file.

This file is imported by path on both sides (hybridrl's ``custom_reward_function.path``, and TRL's runner in its own
virtual environment), so it imports nothing from hybridrl, TRL or torch: the reward is the same code on both sides.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

_INTEGER = re.compile(r"-?\d+")

PROMPT_STYLES = {
    # the tiny char-level model: the demo's "a+b=" format (every character is in its vocabulary)
    "bare": "{a}+{b}=",
    # a chat model: a question; a 135M instruct model answers single-digit sums right about 2 times in 3
    "question": "What is {a} + {b}? Answer with just the number.",
}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    """1.0 if the *last* integer in the response equals ``ground_truth``, else 0.0.

    The last integer, not the first: a chat model often restates the question ("3 + 4 = 7") before answering.
    """
    found = _INTEGER.findall(solution_str)
    return float(bool(found) and int(found[-1]) == int(ground_truth))


def write_rows(path: Path, num_rows: int, style: str, max_operand: int, seed: int = 0) -> Path:
    """``num_rows`` addition problems as hybridrl prompt rows (JSON lines), operands in ``0..max_operand``.

    Each row: ``{"data_source", "prompt": [{"role": "user", "content"}], "reward_model": {"ground_truth"}}``.
    """
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as file:
        for _ in range(num_rows):
            a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
            row = {"data_source": "vs_trl_addition",
                   "prompt": [{"role": "user", "content": PROMPT_STYLES[style].format(a=a, b=b)}],
                   "reward_model": {"style": "rule", "ground_truth": str(a + b)}}
            file.write(json.dumps(row) + "\n")
    return path


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
