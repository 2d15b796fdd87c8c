"""Reward for competition-math data (MATH and its variants) through ``math-verify``.

Both sides are parsed with ``math_verify.parse`` and compared symbolically with ``math_verify.verify`` (so
``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` agree). The ground truth is wrapped in ``\\boxed{...}`` unless it already
holds one, because bare LaTeX such as ``x^2+1`` is not found by math-verify's unanchored extraction; the response is
parsed as written (math-verify prefers the last ``\\boxed{}`` answer).

math-verify enforces its own timeout (:data:`MATH_VERIFY_TIMEOUT_S` per parse and per verify) with ``SIGALRM``, which
only works on a process's main thread — as in the reward worker processes of
:class:`~hybridrl.rewards.scorer.RewardScorer`. Called from another thread, the inner timeout is disabled and only
the scorer's per-sample timeout applies.

``math_verify`` is imported on first use (it pulls in sympy, ~0.3 s).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["MATH_VERIFY_TIMEOUT_S", "compute_score"]

MATH_VERIFY_TIMEOUT_S = 5
"""Seconds math-verify may spend on one parse or one verify before it gives up (whole seconds: it uses alarm())."""


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    *,
    timeout_s: int = MATH_VERIFY_TIMEOUT_S,
) -> dict[str, Any]:
    """1.0 if math-verify finds the response's answer equivalent to ``ground_truth``, else 0.0.

    Returns:
        ``{"score": 0.0|1.0, "acc": 0.0|1.0}``.

    Raises:
        ValueError: if math-verify cannot parse ``ground_truth`` at all (a data error).
    """
    from math_verify import parse, verify

    timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
    gold_text = str(ground_truth)
    if "\\boxed" not in gold_text:
        gold_text = f"\\boxed{{{gold_text}}}"
    gold = parse(gold_text, parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math ground_truth {ground_truth!r} could not be parsed by math-verify")
    prediction = parse(solution_str, parsing_timeout=timeout)
    correct = float(bool(prediction) and verify(gold, prediction, timeout_seconds=timeout))
    return {"score": correct, "acc": correct}
