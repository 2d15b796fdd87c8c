"""Configuration of reward scoring: the rule function (``custom_reward_function``), the reward-model group
(``reward_model``) and how their scores are fused (``reward_fusion``). Part of :mod:`hybridrl.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridrl.config.frozen import FreezableConfig


@dataclass
class RewardModelConfig(FreezableConfig):
    enable: bool = False
    """Score responses with a reward-model worker group (in addition to, or instead of, rule rewards)."""
    model_path: Optional[str] = None
    """Reward-model directory (``AutoModelForSequenceClassification``)."""
    micro_batch_size_per_gpu: int = 4
    """Sequences per reward-model forward on one device."""
    n_gpus: int = 0
    """Where the reward-model group runs: ``0`` colocated on the actor's devices (its own process on each, sharing
    the device); ``N > 0`` its own pool of ``N`` devices on one node (``trainer.device``'s type), so a large reward
    model need not share memory with the policy."""


@dataclass
class RewardFusionConfig(FreezableConfig):
    enable: bool = False
    """Fuse reward components (rule score, reward model, guards) into one score; on whenever the reward model is."""
    rule_weight: float = 1.0
    """Weight of the rule-function score (``reward/rule/*``)."""
    rm_weight: float = 1.0
    """Weight of the reward model's score (``reward/rm/*``)."""
    normalize: list[str] = field(default_factory=list)
    """Components normalised by a running mean/std before weighting, e.g. ``[rm]`` (``rule``, ``rm``)."""
    weighting: str = "fixed"
    """``fixed``: the weights above. ``inverse_std`` (dynamic): the rule and RM weights are divided by each one's
    running standard deviation over all batches so far, so each contributes by its weight whatever its spread; the
    effective weights are logged as ``reward/<name>/weight``. Guards keep their coefficients."""
    length_penalty_coef: float = 0.0
    """Length guard: adds ``−coef · response_length / data.max_response_length`` (0 disables)."""
    diversity_penalty_coef: float = 0.0
    """Diversity guard: adds ``−coef ×`` mean similarity to the other responses of the same prompt (0 disables)."""
    cap: Optional[float] = None
    """Upper bound on the fused reward (``null``: none)."""


@dataclass
class CustomRewardConfig(FreezableConfig):
    path: Optional[str] = None
    """Python file defining your reward function; ``null`` uses the built-in registry routed by ``data_source``."""
    name: str = "compute_score"
    """Function name inside ``path``: ``(data_source, solution_str, ground_truth, extra_info) -> float``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the reward function. A custom function gets them all; a built-in one those it declares
    (refused if none does): gsm8k ``correct_score`` (1.0), ``unformatted_correct_score`` (0.5: a right number
    without ``####``; 0 = verl's strict scoring), ``format_score`` (0.0: a wrong ``#### N``); math_dapo / aime*
    ``correct_score`` (1.0), ``incorrect_score`` (-1.0); searchR1_* ``correct_score``, ``format_score``; math
    ``timeout_s``. Example: ``+custom_reward_function.reward_kwargs.unformatted_correct_score=0``."""
    timeout_s: float = 10.0
    """Per-sample timeout; a reward function that hangs or raises scores 0 and is counted as a warning."""
