"""Reward for the synthetic ``arithmetic`` task (:mod:`hybridrl.data.synthetic`): exact numeric match.

The task's target response is exactly the answer (``"23+45="`` → ``"68"``). The whole response, with surrounding
whitespace stripped, must be one number equal to the ground truth: ``"68"``, ``" 68\\n"`` and ``"068"`` score 1.0;
``"68 apples"``, ``"6868"`` or ``"= 68"`` score 0.0. Being strict keeps a tiny model from being paid for padding the
answer with extra tokens.

``arithmetic_judge`` (:mod:`hybridrl.data.judge_arithmetic`): a judge's reply ``"<its own answer>:<verdict>"``
(``"65:0"``) scores 1.0 when the verdict after the last colon is the ground truth (``"1"`` right, ``"0"`` wrong).
"""

from __future__ import annotations

from typing import Any

from hybridrl.rewards.numeric import parse_number

__all__ = ["compute_score", "judge_verdict_score"]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, float]:
    """1.0 if the whole response is a number equal to ``ground_truth``, else 0.0.

    Returns:
        ``{"score": 0.0|1.0, "acc": 0.0|1.0}``.

    Raises:
        ValueError: if ``ground_truth`` is not a number.
    """
    expected = parse_number(ground_truth)
    if expected is None:
        raise ValueError(f"arithmetic ground_truth {ground_truth!r} is not a number")
    stripped = solution_str.strip()
    # parse_number tolerates "$" and a trailing full stop for prose answers; this task wants the bare number.
    answer = parse_number(stripped) if stripped[:1] != "$" and stripped[-1:] != "." else None
    correct = float(answer is not None and answer == expected)
    return {"score": correct, "acc": correct}


def judge_verdict_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> dict[str, Any]:
    """1.0 if the verdict after the reply's last ``:`` equals ``ground_truth`` (``"1"`` / ``"0"``), else 0.0.

    Returns:
        ``{"score": 0.0|1.0, "acc": 0.0|1.0, "pred": verdict}``.
    """
    verdict = solution_str.strip().rpartition(":")[2].strip()
    correct = float(verdict == str(ground_truth).strip())
    return {"score": correct, "acc": correct, "pred": verdict}
