"""The result of scoring one sample, and the rules that turn whatever a reward function returns into one.

A reward function may return a real number, or a dict with a ``"score"`` key and extra per-sample values (``acc``,
``pred``, …). Anything else — an exception, ``NaN``/``inf``, a string, a dict without ``"score"`` — becomes
score 0 with a status that the scorer counts and reports, so one bad sample never stops a run nor passes silently.

Pure Python (no torch): used inside the reward worker processes.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OK", "ERROR", "INVALID", "TIMEOUT", "CRASHED", "FAILURE_STATUSES", "ScoreOutcome", "call_reward_fn",
           "normalize_reward_value"]

OK = "ok"
ERROR = "error"  # the function raised
INVALID = "invalid"  # it returned NaN, inf, or something that is not a number
TIMEOUT = "timeout"  # it ran longer than the per-sample timeout; its worker process was killed
CRASHED = "crashed"  # its worker process died (segfault, os._exit, out of memory)
FAILURE_STATUSES = (ERROR, INVALID, TIMEOUT, CRASHED)


@dataclass(frozen=True)
class ScoreOutcome:
    """One sample's score (0.0 unless ``status == "ok"``), extras returned alongside it, and why it failed."""

    status: str
    score: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)
    message: str = ""


def normalize_reward_value(value: Any) -> ScoreOutcome:
    """Turn a reward function's return value into a :class:`ScoreOutcome` (see the module docstring)."""
    extras: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            return ScoreOutcome(INVALID, message=f"returned a dict without a 'score' key (keys: {sorted(value)[:8]})")
        extras = {str(key): item for key, item in value.items() if key != "score"}
        value = value["score"]
    if hasattr(value, "item") and not isinstance(value, numbers.Real):  # numpy / torch scalars
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            pass
    if not isinstance(value, numbers.Real):
        return ScoreOutcome(INVALID, extras=extras, message=f"returned a {type(value).__name__}, not a number")
    score = float(value)
    if not math.isfinite(score):
        return ScoreOutcome(INVALID, extras=extras, message=f"returned {score}")
    return ScoreOutcome(OK, score, extras)


def call_reward_fn(function: Callable[..., Any], arguments: tuple[Any, ...]) -> ScoreOutcome:
    """Call ``function(*arguments)`` and normalise the result; an exception (even ``SystemExit``) becomes ``error``."""
    try:
        value = function(*arguments)
    except (Exception, SystemExit) as error:
        return ScoreOutcome(ERROR, message=f"raised {type(error).__name__}: {error}")
    return normalize_reward_value(value)
