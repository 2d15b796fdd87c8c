"""Reward for DAPO-style math data (``math_dapo``, ``aime*``): the answer is on an ``Answer:`` line, scored ±1.

DAPO's prompts (the DAPO-Math-17k set, and the AIME sets its recipe validates on) end with *"The last line of your
response should be of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem."* The
DAPO paper scores a response **+1** when that answer is right and **−1** otherwise (a missing ``Answer:`` line
included): no partial credit, no separate format reward.

Extraction: the text after the *last* ``Answer:`` (any case) up to the end of its line, with what commonly wraps an
answer removed — ``$…$``, ``\\(…\\)``, ``\\boxed{…}``, ``**…**``, a trailing full stop. Comparison, the first that
decides: exact decimal equality when both sides are plain numbers (``1,080`` = ``1080.00``; ``3.50`` = ``3.5``);
else math-verify's symbolic equivalence (``\\frac{1}{2}`` = ``0.5``), see :mod:`hybridrl.rewards.math_reward`.
"""

from __future__ import annotations

import re
from typing import Any

from hybridrl.rewards.math_reward import MATH_VERIFY_TIMEOUT_S, equivalent
from hybridrl.rewards.numeric import parse_number

__all__ = ["CORRECT_SCORE", "INCORRECT_SCORE", "extract_answer_line", "compute_score"]

CORRECT_SCORE = 1.0
INCORRECT_SCORE = -1.0

_ANSWER_LINE_RE = re.compile(r"answer\s*:\s*(.*)", re.IGNORECASE)
_WRAPPERS = (  # (opening, closing) pairs removed from around an answer, outermost first
    ("**", "**"), ("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("\\boxed{", "}"), ("\\text{", "}"),
)


def extract_answer_line(response: str) -> str | None:
    """The answer on the last ``Answer:`` line of ``response``, unwrapped (see the module docstring), or ``None``
    when there is no ``Answer:`` or nothing follows it."""
    matches = _ANSWER_LINE_RE.findall(response)
    if not matches:
        return None
    answer = matches[-1].strip()
    changed = True
    while changed and answer:
        changed = False
        answer = answer.strip("* ").rstrip(". ")  # bold markers may open before "Answer:"
        for opening, closing in _WRAPPERS:
            if answer.startswith(opening) and answer.endswith(closing) and len(answer) >= len(opening) + len(closing):
                answer, changed = answer[len(opening):len(answer) - len(closing)].strip(), True
                break
    return answer or None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct_score: float = CORRECT_SCORE,
    incorrect_score: float = INCORRECT_SCORE,
    timeout_s: int = MATH_VERIFY_TIMEOUT_S,
) -> dict[str, Any]:
    """``correct_score`` (+1) when the ``Answer:`` line equals ``ground_truth``, else ``incorrect_score`` (−1).

    Returns:
        ``{"score": float, "acc": 0.0|1.0, "format_ok": 0.0|1.0, "pred": str}`` (``format_ok``: an ``Answer:`` line
        was found).

    Raises:
        ValueError: if ``ground_truth`` is empty (a data error, not a model error).
    """
    gold = str(ground_truth).strip()
    if not gold:
        raise ValueError("math_dapo ground_truth is empty")
    prediction = extract_answer_line(solution_str)
    correct = prediction is not None and _same_answer(prediction, gold, timeout_s)
    return {"score": float(correct_score if correct else incorrect_score), "acc": float(correct),
            "format_ok": float(prediction is not None), "pred": prediction or ""}


def _same_answer(prediction: str, gold: str, timeout_s: int) -> bool:
    predicted_number, gold_number = parse_number(prediction), parse_number(gold)
    if predicted_number is not None and gold_number is not None:
        return predicted_number == gold_number
    return equivalent(gold, prediction, timeout_s=timeout_s, boxed=True)
