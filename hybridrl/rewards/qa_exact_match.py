"""Reward for open-domain question answering (Search-R1's data sources: ``searchR1_nq``, ``…_triviaqa``, …): the
exact match of the answer in the last ``<answer>…</answer>`` against any of the accepted answers.

Both sides are normalised as in SQuAD's exact-match metric: lower case, punctuation removed, the articles *a*, *an*
and *the* removed, whitespace collapsed — so ``<answer> The Eiffel Tower. </answer>`` matches ``eiffel tower``. The
ground truth is one string, a list of strings, or ``{"target": [...]}`` (Search-R1's parquet layout).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from typing import Any

__all__ = ["normalize_answer", "accepted_answers", "compute_score"]

_ANSWER_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    return " ".join(_ARTICLES_RE.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def accepted_answers(ground_truth: Any) -> list[str]:
    """The accepted answers as strings, from a string, a list, or a mapping with ``"target"``.

    Raises:
        ValueError: if there is no non-empty answer (a data error).
    """
    if isinstance(ground_truth, Mapping):
        if "target" not in ground_truth:
            raise ValueError(f"QA ground_truth {dict(ground_truth)!r} has no 'target' key")
        ground_truth = ground_truth["target"]
    answers = [ground_truth] if isinstance(ground_truth, str) else list(ground_truth)
    answers = [str(answer) for answer in answers if normalize_answer(str(answer))]
    if not answers:
        raise ValueError("QA ground_truth holds no non-empty answer")
    return answers


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    correct_score: float = 1.0,
    format_score: float = 0.0,
) -> dict[str, Any]:
    """``correct_score`` when the last ``<answer>`` matches an accepted answer; ``format_score`` when there is an
    ``<answer>`` that does not; 0.0 without one.

    Returns:
        ``{"score": float, "acc": 0.0|1.0, "format_ok": 0.0|1.0, "pred": str}``.
    """
    targets = {normalize_answer(answer) for answer in accepted_answers(ground_truth)}
    tagged = _ANSWER_TAG_RE.findall(solution_str)
    prediction = tagged[-1].strip() if tagged else None
    correct = prediction is not None and normalize_answer(prediction) in targets
    score = correct_score if correct else (format_score if prediction is not None else 0.0)
    return {"score": float(score), "acc": float(correct), "format_ok": float(prediction is not None),
            "pred": prediction or ""}
