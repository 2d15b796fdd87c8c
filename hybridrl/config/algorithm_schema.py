"""Configuration of the algorithm: advantage estimation, KL in the reward, DAPO's dynamic sampling and overlong
shaping (the ``algorithm`` section). Part of :mod:`hybridrl.config.schema`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.async_schema import OffPolicyCorrectionConfig
from hybridrl.config.frozen import FreezableConfig


@dataclass
class KLControlConfig(FreezableConfig):
    type: str = "fixed"
    """KL coefficient controller: ``fixed`` | ``adaptive`` | ``scheduled``."""
    kl_coef: float = 0.001
    """Initial (or fixed) KL coefficient."""
    target_kl: float = 0.1
    """Adaptive controller: target KL per token."""
    horizon: int = 10000
    """Adaptive controller: horizon in samples."""
    target_kl_coef: float = 0.0
    """Scheduled controller: the coefficient reached at the end of training (warm-up oscillation, square-root ramp,
    then a quadratic approach to this value)."""


@dataclass
class FilterGroupsConfig(FreezableConfig):
    enable: bool = False
    """DAPO dynamic sampling: drop prompt groups whose responses all scored the same (no learning signal) and
    generate more prompts until ``data.train_batch_size`` informative groups are collected."""
    max_num_gen_batches: int = 10
    """Give up (with an error) after this many generation batches in one step; raise it or lower the filter."""
    metric: str = "seq_reward"
    """What must differ within a kept group: ``seq_reward`` (the sum of a response's token-level scores, reward
    shaping such as the overlong buffer included) | ``score`` (the reward function's score, before shaping) |
    ``seq_final_reward`` (verl's name for the reward after KL-in-reward; equal to ``seq_reward`` and accepted only
    with ``algorithm.use_kl_in_reward=false``, since hybridrl filters before the KL penalty) | the name of a number
    the reward function returns beside its score (``acc`` from ``{"score": …, "acc": …}``, as verl's DAPO recipes
    use; a batch where it is missing stops the run naming it)."""


@dataclass
class OverlongBufferConfig(FreezableConfig):
    enable: bool = False
    """DAPO overlong reward shaping: a linear penalty for responses in the last ``len`` tokens before the limit."""
    len: int = 64
    """Width of the buffer in tokens (must be < ``data.max_response_length``)."""
    penalty_factor: float = 1.0
    """Penalty at the limit; it grows linearly from 0 at ``max_response_length − len``."""


@dataclass
class DistillationConfig(FreezableConfig):
    teacher_path: Optional[str] = None
    """On-policy distillation: a frozen teacher (a Hugging Face model directory with the policy's vocabulary,
    checked at start) scores the student's samples token by token, and each token's reverse KL
    ``log π_s − log π_t`` joins its advantage (``hybridrl/algorithms/distillation.py``). ``null``: off."""
    kl_coef: float = 1.0
    """λ ≥ 0: the weight of the per-token reverse KL in the advantage."""
    task_weight: float = 1.0
    """w ≥ 0: the weight of the task's advantage (the reward's, by ``adv_estimator``); 0: distillation alone."""


@dataclass
class AlgorithmConfig(FreezableConfig):
    adv_estimator: str = "grpo"
    """Advantage estimator: ``gae`` | ``grpo`` | ``drgrpo`` | ``rloo`` | ``reinforce_plus_plus`` | ``reinforce_plus_plus_baseline`` | ``remax``."""
    gamma: float = 1.0
    """Discount factor."""
    lam: float = 1.0
    """GAE lambda."""
    norm_adv_by_std_in_grpo: bool = True
    """GRPO: divide by the group's reward std (false gives Dr. GRPO's estimator)."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_ctrl.kl_coef × KL(policy || reference)`` from the token-level reward."""
    kl_penalty: str = "kl"
    """KL estimator used in the reward: ``k1``/``kl`` | ``abs`` | ``k2``/``mse`` | ``k3``/``low_var_kl``."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL-in-reward coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling (needs a group estimator and ``rollout.n >= 2``)."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO overlong reward shaping."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation from a teacher model (off unless ``teacher_path`` is set)."""
    off_policy_correction: OffPolicyCorrectionConfig = field(default_factory=OffPolicyCorrectionConfig)
    """Importance correction for the rollout engine's policy differing from the trainer's (numerics, or older
    weights in ``async_training``)."""
