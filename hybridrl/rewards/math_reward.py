"""Reward for competition-math data (MATH and its variants) through ``math-verify``.

Both sides are parsed with ``math_verify.parse`` and compared symbolically with ``math_verify.verify`` (so
``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` agree). The ground truth is wrapped in ``\\boxed{...}`` unless it already
holds one, because bare LaTeX such as ``x^2+1`` is not found by math-verify's unanchored extraction; the response is
parsed as written (math-verify prefers the last ``\\boxed{}`` answer).

math-verify enforces its own timeout (:data:`MATH_VERIFY_TIMEOUT_S` per parse and per verify) with ``SIGALRM``, which
only works on a process's main thread — as in the reward worker processes of
:class:`~hybridrl.rewards.scorer.RewardScorer`. Called from another thread, the inner timeout is disabled and only
the scorer's per-sample timeout applies.

Unicode vulgar fractions, which math-verify does not read, are rewritten as LaTeX first (``¼`` → ``\\frac{1}{4}``,
``1½`` → ``\\frac{3}{2}``).

``math_verify`` is imported on first use (it pulls in sympy, ~0.3 s). Its LaTeX parser (latex2sympy2) needs the ANTLR
runtime 4.13: with 4.9.3 (which Hydra 1.3 pins) answers such as ``\\boxed{10\\%}`` silently fail to parse and score 0.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from fractions import Fraction
from typing import Any

__all__ = ["MATH_VERIFY_TIMEOUT_S", "compute_score", "equivalent", "unicode_fractions_as_latex"]

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
    correct = float(equivalent(str(ground_truth), solution_str, timeout_s=timeout_s))
    return {"score": correct, "acc": correct}


def equivalent(gold_text: str, prediction_text: str, *, timeout_s: int = MATH_VERIFY_TIMEOUT_S,
               boxed: bool = False) -> bool:
    """Whether math-verify finds ``prediction_text``'s answer equivalent to the answer ``gold_text``.

    ``gold_text`` is wrapped in ``\\boxed{}`` unless it holds one; ``prediction_text`` is parsed as written (a whole
    response: math-verify prefers its last ``\\boxed{}``), or wrapped too with ``boxed=True`` (an answer already
    extracted).

    Raises:
        ValueError: if math-verify cannot parse ``gold_text`` at all (a data error).
    """
    from math_verify import parse, verify

    timeout = timeout_s if threading.current_thread() is threading.main_thread() else None
    gold = parse(_boxed(unicode_fractions_as_latex(gold_text)), parsing_timeout=timeout)
    if not gold:
        raise ValueError(f"math ground_truth {gold_text!r} could not be parsed by math-verify")
    prediction_text = unicode_fractions_as_latex(prediction_text)
    prediction = parse(_boxed(prediction_text) if boxed else prediction_text, parsing_timeout=timeout)
    return bool(prediction) and bool(verify(gold, prediction, timeout_seconds=timeout))


def _boxed(text: str) -> str:
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"


_VULGAR_FRACTION_RE = re.compile(r"(\d*)([\u00bc-\u00be\u2150-\u215e\u2189])")


def unicode_fractions_as_latex(text: str) -> str:
    """``text`` with each Unicode vulgar fraction, and a whole number written before it, as one ``\\frac{p}{q}``
    (``"1½ cups"`` → ``"\\frac{3}{2} cups"``)."""
    def as_latex(match: re.Match) -> str:
        numerator, _, denominator = unicodedata.decomposition(match.group(2)).partition("2044")
        value = Fraction(int("".join(chr(int(code, 16)) for code in numerator.split()[1:])),
                         int("".join(chr(int(code, 16)) for code in denominator.split())))
        value += int(match.group(1) or 0)
        return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"

    return _VULGAR_FRACTION_RE.sub(as_latex, text)
