"""The algorithm library: pure tensor functions, no Ray, no ``torch.distributed``.

- advantages: :data:`ADVANTAGE_ESTIMATORS` (``gae``, ``grpo``, ``drgrpo``, ``rloo``, ``reinforce_plus_plus``,
  ``reinforce_plus_plus_baseline``, ``remax``) → ``(advantages, returns)``, ``[batch, response_len]``;
- losses: :data:`POLICY_LOSSES` (``vanilla``, ``gspo``, ``cispo``) and :func:`value_loss` → ``(loss, metrics)``;
- aggregation: :func:`aggregate_loss` with an explicit global ``normalizer`` (see :func:`loss_normalizer`), the
  gradient-accumulation invariant of the project;
- KL: :func:`kl_penalty` estimators and KL-coefficient controllers (:func:`build_kl_controller`);
- logits: chunked, memory-bounded :func:`log_probs_from_logits` and :func:`entropy_from_logits`;
- masked: :func:`masked_mean`, :func:`masked_whiten` and friends;
- off_policy: truncated / masked importance sampling and the decoupled PPO loss, for samples the trainer's weights
  did not generate (asynchronous training, or another engine's numerics).
"""

from hybridrl.algorithms.advantages import ADVANTAGE_ESTIMATORS, group_ids
from hybridrl.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss, loss_normalizer
from hybridrl.algorithms.kl import KL_PENALTY_KINDS, kl_penalty
from hybridrl.algorithms.kl_controllers import (
    KL_CONTROLLER_KINDS,
    AdaptiveKLController,
    FixedKLController,
    ScheduledKLController,
    build_kl_controller,
)
from hybridrl.algorithms.logits import entropy_from_logits, log_probs_from_logits, token_log_probs_and_entropy
from hybridrl.algorithms.losses import POLICY_LOSSES, value_loss
from hybridrl.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from hybridrl.algorithms.off_policy import decoupled_ppo_token_loss, masked_importance, truncated_importance_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "group_ids",
    "LOSS_AGG_MODES",
    "aggregate_loss",
    "loss_normalizer",
    "KL_PENALTY_KINDS",
    "kl_penalty",
    "KL_CONTROLLER_KINDS",
    "AdaptiveKLController",
    "FixedKLController",
    "ScheduledKLController",
    "build_kl_controller",
    "entropy_from_logits",
    "log_probs_from_logits",
    "token_log_probs_and_entropy",
    "POLICY_LOSSES",
    "value_loss",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "decoupled_ppo_token_loss",
    "masked_importance",
    "truncated_importance_weights",
]
