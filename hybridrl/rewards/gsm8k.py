"""Rule-based reward for GSM8K (grade-school math word problems with one numeric answer).

Answer extraction, in order:

1. **Strict**: the number after the *last* ``####`` marker (``"... #### 1,080"`` → ``1,080``; a ``$`` before the
   number is allowed). The preprocessed prompts ask the model to end with ``#### <answer>``
   (:mod:`hybridrl.data.preprocess`).
2. **Fallback**: when no ``####`` marker is followed by a number, the *last* number anywhere in the response. Small
   models often state the answer without the marker; the last number is the usual place for it (the first is often
   an operand restated from the question).

Scores (the choice, and why): a correct answer in the requested format earns :data:`CORRECT_SCORE` (1.0). A correct
answer found only by the fallback earns :data:`UNFORMATTED_CORRECT_SCORE` (0.5): enough signal for a weak model to
start learning, while the format still pays. A wrong or missing answer earns :data:`FORMAT_SCORE` (0.0) if the
format was followed, else 0.0 — set ``format_score > 0`` to reward the format alone. The returned extras report
``acc`` (1.0 if the extracted answer is right, by either route — the number to report as accuracy) and
``format_ok`` (1.0 if the strict route found an answer), independent of the shaping.

Answers compare exactly as decimals with commas removed (:mod:`hybridrl.rewards.numeric`).
"""

from __future__ import annotations

import re
from typing import Any

from hybridrl.rewards.numeric import NUMBER_PATTERN, last_number, parse_number

__all__ = ["CORRECT_SCORE", "UNFORMATTED_CORRECT_SCORE", "FORMAT_SCORE", "extract_gsm8k_answer", "compute_score"]

CORRECT_SCORE = 1.0
UNFORMATTED_CORRECT_SCORE = 0.5
FORMAT_SCORE = 0.0

_MARKED_ANSWER_RE = re.compile(rf"####\s*\$?\s*({NUMBER_PATTERN})")


def extract_gsm8k_answer(response: str) -> tuple[str | None, bool]:
    """The answer in ``response`` and whether it came from the strict ``#### N`` route.

    Returns:
        ``(answer, strict)``: ``answer`` as written (commas kept) or ``None`` if the response holds no number;
        ``strict`` is True when the answer followed a ``####`` marker.
    """
    marked = _MARKED_ANSWER_RE.findall(response)
    if marked:
        return marked[-1], True
    return last_number(response), False


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct_score: float = CORRECT_SCORE,
    unformatted_correct_score: float = UNFORMATTED_CORRECT_SCORE,
    format_score: float = FORMAT_SCORE,
) -> dict[str, Any]:
    """Score one GSM8K response against its numeric ground truth (see the module docstring for the rules).

    Returns:
        ``{"score": float, "acc": 0.0|1.0, "format_ok": 0.0|1.0, "pred": str}``.

    Raises:
        ValueError: if ``ground_truth`` is not a number (a data error, not a model error).
    """
    expected = parse_number(ground_truth)
    if expected is None:
        raise ValueError(f"gsm8k ground_truth {ground_truth!r} is not a number")
    answer, strict = extract_gsm8k_answer(solution_str)
    correct = answer is not None and parse_number(answer) == expected
    if correct:
        score = correct_score if strict else unformatted_correct_score
    else:
        score = format_score if strict else 0.0
    return {"score": float(score), "acc": float(correct), "format_ok": float(strict), "pred": answer or ""}
