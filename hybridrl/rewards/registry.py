"""Built-in rule-based reward functions, routed by each sample's ``data_source``.

Every reward function has the signature ``(data_source, solution_str, ground_truth, extra_info) -> float | dict``
(a dict holds ``"score"`` plus extras such as ``"acc"``). :func:`default_compute_score` looks the function up in
:data:`RE==========================================================================  =========================================
data_source                                                                 function
==========================================================================  =========================================
``openai/gsm8k``, ``gsm8k``, ``arithmetic_word_problems``                   :mod:`hybridrl.rewards.gsm8k` (1 / 0.5 / 0)
``math``, ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,       :mod:`hybridrl.rewards.math_reward`
``HuggingFaceH4/MATH-500``, ``hiyouga/geometry3k``, ``numina_aops_forum``,  (``\\boxed{}``, math-verify; 1 / 0)
``numina_synthetic_math``, ``numina_amc_aime``, ``numina_synthetic_amc``,
``numina_cn_k12``, ``numina_olympiads``
``math_dapo``, ``math_dapo_reasoning``, and every source starting ``aime``     :mod:`hybridrl.rewards.math_dapo`
                                                                            (``Answer:`` line; +1 / −1)
``searchR1_nq``, ``searchR1_triviaqa``, ``searchR1_popqa``,                 :mod:`hybridrl.rewards.qa_exact_match`
``searchR1_hotpotqa``, ``searchR1_2wikimultihopqa``, ``searchR1_musique``,  (``<answer>`` exact match; 1 / 0)
``searchR1_bamboogle``
``arithmetic`` (the synthetic task)                                         :mod:`hybridrl.rewards.arithmetic`
``arithmetic_judge`` (verdicts on its answers)                              :mod:`hybridrl.rewards.arithmetic`
``shapes`` (the synthetic image task)                                       :mod:`hybridrl.rewards.shapes`
==========================================================================  =========================================

verl routes ``math`` to its DAPO scorer; here ``math`` is the ``\\boxed{}`` scorer (which also reads a final
``Answer: 42``, as math-verify finds the last answer-like expression). Code sources (``codecontests``, ``apps``, …)
need test execution: write a custom reward function around :func:`hybridrl.rewards.sandbox.score_code`.

Keyword arguments (``custom_reward_function.reward_kwargs``) go to each built-in function that declares them, e.g.
``reward_kwargs.unformatted_correct_score=0`` makes GSM8K strict (verl's default: no credit without ``####``);
a keyword that no built-in function declares is refused (:func:`check_reward_kwargs`).

Adding a data source: register a function in a module that is imported when this one is (the reward worker
processes import this module, not your script), or point ``custom_reward_function.path`` at a Python file.

This module is pure Python (no torch): the reward worker processes import it and should start fast.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

from hybridrl.rewards import arithmetic, gsm8k, math_dapo, math_reward, qa_exact_match, shapes
from hybridrl.utils.registry import Registry

__all__ = ["RewardFn", "REWARD_FUNCTIONS", "PREFIX_ROUTES", "reward_function_for", "default_compute_score",
           "check_data_sources", "check_reward_kwargs", "keywords_of", "warm_up"]

RewardFn = Callable[[str, str, Any, Union[dict, None]], Union[float, dict]]
"""``(data_source, solution_str, ground_truth, extra_info) -> float | {"score": float, **extras}``."""

REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function (data_source)")

for _source in ("openai/gsm8k", "gsm8k", "arithmetic_word_problems"):
    REWARD_FUNCTIONS.register(_source)(gsm8k.compute_score)
for _source in ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                "hiyouga/geometry3k",
                *(f"numina_{name}" for name in ("aops_forum", "synthetic_math", "amc_aime", "synthetic_amc", "cn_k12",
                                                "olympiads"))):
    REWARD_FUNCTIONS.register(_source)(math_reward.compute_score)
for _source in ("math_dapo", "math_dapo_reasoning"):
    REWARD_FUNCTIONS.register(_source)(math_dapo.compute_score)
for _source in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"):
    REWARD_FUNCTIONS.register(f"searchR1_{_source}")(qa_exact_match.compute_score)
REWARD_FUNCTIONS.register("arithmetic")(arithmetic.compute_score)
REWARD_FUNCTIONS.register("arithmetic_judge")(arithmetic.judge_verdict_score)
REWARD_FUNCTIONS.register("shapes")(shapes.compute_score)

PREFIX_ROUTES: dict[str, RewardFn] = {"aime": math_dapo.compute_score}
"""``prefix -> function`` for families of sources (``aime24``, ``aime-2025``, …) without an exact entry."""


def reward_function_for(data_source: str) -> RewardFn:
    """The built-in function for ``data_source``: its exact entry, else the longest matching prefix route.

    Raises:
        UnknownNameError: (a ``KeyError`` and ``ValueError``) listing the known sources.
    """
    if data_source in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[data_source]
    prefixes = sorted((prefix for prefix in PREFIX_ROUTES if str(data_source).startswith(prefix)), key=len)
    if prefixes:
        return PREFIX_ROUTES[prefixes[-1]]
    return REWARD_FUNCTIONS[data_source]  # raises, naming the valid names


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None, **reward_kwargs: Any
) -> float | dict:
    """Score one response with the built-in function for ``data_source``, passing it those ``reward_kwargs`` it
    declares (see :func:`keywords_of`)."""
    function = reward_function_for(data_source)
    accepted = keywords_of(function)
    keywords = {key: value for key, value in reward_kwargs.items() if key in accepted}
    return function(data_source, solution_str, ground_truth, extra_info, **keywords)


@functools.lru_cache(maxsize=None)  # asked once per scored sample: read each function's signature once
def keywords_of(function: RewardFn) -> tuple[str, ...]:
    """The keyword-only parameters ``function`` declares (what ``reward_kwargs`` may set for it)."""
    return tuple(name for name, parameter in inspect.signature(function).parameters.items()
                 if parameter.kind is inspect.Parameter.KEYWORD_ONLY)


def check_reward_kwargs(reward_kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming each ``custom_reward_function.reward_kwargs`` key that no built-in function
    declares, with what each function does take."""
    functions = {function.__module__.rsplit(".", 1)[-1]: function
                 for function in (*REWARD_FUNCTIONS.values(), *PREFIX_ROUTES.values())}
    known = {key for function in functions.values() for key in keywords_of(function)}
    unknown = sorted(set(reward_kwargs) - known)
    if unknown:
        takes = "; ".join(f"{name}: {', '.join(keywords_of(function)) or '-'}" for name, function in functions.items())
        raise ValueError(f"custom_reward_function.reward_kwargs: no built-in reward function takes {unknown} "
                         f"(they take: {takes})")


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
        try:
            reward_function_for(source)
        except KeyError:
            prefixes = ", ".join(f"{prefix}*" for prefix in PREFIX_ROUTES)
            raise ValueError(
                f"sample {index}: no reward function for data_source={source!r}; built-in sources: "
                f"{', '.join(REWARD_FUNCTIONS.names())}, {prefixes} (or set custom_reward_function.path)"
            ) from None
