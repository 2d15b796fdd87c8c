"""Built-in rule-based reward functions, routed by each sample's ``data_source``.

Every reward function has the signature ``(data_source, solution_str, ground_truth, extra_info) -> float | dict``
(a dict holds ``"score"`` plus extras such as ``"acc"``). :func:`default_compute_score` looks the function up in
:data:`REWARD_FUNCTIONS` by ``data_source``; an unknown source is a ``ValueError`` listing the known ones (never a
silent 0).

=================================================================================  ==================================
data_source                                                                        function
=================================================================================  ==================================
``openai/gsm8k``, ``gsm8k``                                                        :mod:`hybridrl.rewards.gsm8k`
``math``, ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,              :mod:`hybridrl.rewards.math_reward`
``HuggingFaceH4/MATH-500``
``arithmetic`` (the synthetic task)                                                :mod:`hybridrl.rewards.arithmetic`
=================================================================================  ==================================

Adding a data source: register a function in a module that is imported when this one is (the reward worker
processes import this module, not your script), or point ``custom_reward_function.path`` at a Python file.

This module is pure Python (no torch): the reward worker processes import it and should start fast.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Union

from hybridrl.rewards import arithmetic, gsm8k, math_reward
from hybridrl.utils.registry import Registry

__all__ = ["RewardFn", "REWARD_FUNCTIONS", "default_compute_score", "check_data_sources", "warm_up"]

RewardFn = Callable[[str, str, Any, Union[dict, None]], Union[float, dict]]
"""``(data_source, solution_str, ground_truth, extra_info) -> float | {"score": float, **extras}``."""

REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function (data_source)")

for _source in ("openai/gsm8k", "gsm8k"):
    REWARD_FUNCTIONS.register(_source)(gsm8k.compute_score)
for _source in ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
    REWARD_FUNCTIONS.register(_source)(math_reward.compute_score)
REWARD_FUNCTIONS.register("arithmetic")(arithmetic.compute_score)


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float | dict:
    """Score one response with the built-in function registered for ``data_source``."""
    return REWARD_FUNCTIONS[data_source](data_source, solution_str, ground_truth, extra_info)


def warm_up() -> None:
    """Import what the built-in functions import lazily (math-verify and sympy, ~0.3 s), so that the first ``math``
    sample a fresh worker scores is not charged for the import against its timeout."""
    try:
        importlib.import_module("math_verify")
    except ImportError:  # pragma: no cover - a math sample then reports the ImportError as its error
        pass


def check_data_sources(data_sources: Sequence[str]) -> None:
    """Raise ``ValueError`` naming the first sample whose ``data_source`` has no built-in reward function."""
    for index, source in enumerate(data_sources):
        if source not in REWARD_FUNCTIONS:
            raise ValueError(
                f"sample {index}: no reward function for data_source={source!r}; built-in sources: "
                f"{', '.join(REWARD_FUNCTIONS.names())} (or set custom_reward_function.path)"
            )
