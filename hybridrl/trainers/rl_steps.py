"""The controller's own steps between worker calls: rewards to token level, KL in the reward, advantages, balancing.

Pure functions on ``Batch`` — no Ray, no process groups — so each is unit-tested directly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from hybridrl.agents.batch import agent_metrics
from hybridrl.agents.episode_rows import episode_rows_metrics, episodes_only, shared_episode_advantages
from hybridrl.algorithms import ADVANTAGE_ESTIMATORS, kl_penalty, masked_mean
from hybridrl.algorithms.distillation import distillation_advantages
from hybridrl.algorithms.off_policy import masked_importance, truncated_importance_weights
from hybridrl.config.async_schema import OffPolicyCorrectionConfig
from hybridrl.config.algorithm_schema import DistillationConfig
from hybridrl.config.schema import AlgorithmConfig
from hybridrl.data.partition import balance_across_ranks
from hybridrl.protocol import Batch, Fields


@dataclass(frozen=True)
class KLInReward:
    """The rewards after the KL penalty, ``[B, R]``, and what the KL controller is fed: ``mean_sequence_kl``, the
    batch mean of each response's per-token KL; ``coef``: the coefficient that was applied."""

    rewards: torch.Tensor
    mean_sequence_kl: float
    coef: float

    def metrics(self) -> dict[str, float]:
        return {"actor/reward_kl_penalty": self.mean_sequence_kl, "actor/reward_kl_coef": self.coef}


def apply_kl_in_reward(batch: Batch, kl_coef: float, kind: str) -> KLInReward:
    """``token_level_rewards = token_level_scores − kl_coef × KL(policy ‖ reference)`` per token."""
    mask = batch[Fields.RESPONSE_MASK]
    kl = kl_penalty(batch[Fields.OLD_LOG_PROBS], batch[Fields.REF_LOG_PROBS], kind) * mask
    rewards = batch[Fields.TOKEN_LEVEL_SCORES] - kl_coef * kl
    sequence_kl = (kl.sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    return KLInReward(rewards, float(sequence_kl), kl_coef)


def compute_advantages(batch: Batch, algorithm: AlgorithmConfig,
                       reward_baselines: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ``[B, R]`` with the configured estimator, grouped by the ``uid`` field; an agent
    episode's other rows get its advantage (``agents/episode_rows.py``). ``reward_baselines``: ``[B]`` (ReMax)."""
    estimator = ADVANTAGE_ESTIMATORS[algorithm.adv_estimator]

    def estimate(rows: Batch, positions: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs = dict(token_level_rewards=rows[Fields.TOKEN_LEVEL_REWARDS], response_mask=rows[Fields.RESPONSE_MASK],
                      gamma=algorithm.gamma, lam=algorithm.lam,
                      norm_adv_by_std_in_grpo=algorithm.norm_adv_by_std_in_grpo)
        if Fields.UID in rows:
            kwargs["index"] = np.asarray(rows[Fields.UID])
        if Fields.VALUES in rows:
            kwargs["values"] = rows[Fields.VALUES]
        if reward_baselines is not None:
            kwargs["reward_baselines"] = reward_baselines if positions is None else reward_baselines[positions]
        return estimator(**kwargs)
    return shared_episode_advantages(batch, estimate)


def with_distillation(batch: Batch, advantages: torch.Tensor, distillation: DistillationConfig,
                      metrics: dict[str, float]) -> torch.Tensor:
    """``advantages`` with on-policy distillation's per-token term when a teacher scored ``batch``
    (``teacher_log_probs``; ``hybridrl/algorithms/distillation.py``), its ``distill/*`` metrics added to ``metrics``;
    as they are without one. The student's log-probs are the trainer's ``old_log_probs`` (a teacher keeps the
    old-log-prob forward on: ``config.sizes.reuses_update_log_probs``)."""
    if not distillation.teacher_path:
        return advantages
    student = batch[Fields.OLD_LOG_PROBS]
    shaped, distill_metrics = distillation_advantages(
        advantages, student, batch[Fields.TEACHER_LOG_PROBS], batch[Fields.RESPONSE_MASK],
        kl_coef=distillation.kl_coef, task_weight=distillation.task_weight)
    metrics.update(distill_metrics)
    return shaped


def off_policy_corrected(batch: Batch, correction: OffPolicyCorrectionConfig,
                         staleness_bound: int = 0) -> tuple[Batch, dict[str, float]]:
    """The batch the actor trains on, corrected for the rollout policy differing from the trainer's, and the ratio's
    statistics (``off_policy/*``). The ratio is ``π_old / π_rollout`` (``old_log_probs`` over ``rollout_log_probs``);
    the correction is ``correction.resolved_kind(staleness_bound)`` (``auto``: ``tis`` for stale samples).

    ``tis``: ``is_weights`` ``[B, R]`` = ``min(ratio, cap)`` (the policy loss multiplies each token's loss by it);
    ``mis``: ``response_mask`` replaced by the tokens (or sequences) whose ratio lies in ``[low, high]`` — the rest
    take no loss and leave the normaliser. ``none``: the batch as it is; the statistics are still logged when both
    log-probs are present (and the batch itself is returned). The input batch is never modified."""
    kind = correction.resolved_kind(staleness_bound)
    if Fields.ROLLOUT_LOG_PROBS not in batch or Fields.OLD_LOG_PROBS not in batch:
        if kind != "none":
            raise ValueError(f"algorithm.off_policy_correction.kind={kind} needs the rollout engine's "
                             f"log-probs ({Fields.ROLLOUT_LOG_PROBS}) and the trainer's ({Fields.OLD_LOG_PROBS}); "
                             f"this batch has: {', '.join(sorted(batch.keys()))}")
        return batch, {}
    proximal, behaviour, mask = batch[Fields.OLD_LOG_PROBS], batch[Fields.ROLLOUT_LOG_PROBS], batch[Fields.RESPONSE_MASK]
    if kind == "mis":
        result = masked_importance(proximal, behaviour, mask, correction.low, correction.high, correction.level)
    else:  # the ratio's statistics for ``none`` too: a cap no weight reaches changes nothing
        result = truncated_importance_weights(proximal, behaviour, mask, correction.cap if kind == "tis"
                                              else float("inf"), correction.level)
    corrected = copy.copy(batch) if kind != "none" else batch
    if kind == "tis":
        corrected[Fields.IS_WEIGHTS] = result.weights
    elif kind == "mis":
        corrected[Fields.RESPONSE_MASK] = result.mask
    return corrected, {f"off_policy/{name}": float(value) for name, value in result.stats.items()}


def balance_batch(batch: Batch, num_ranks: int) -> Batch:
    """Reorder rows so each of the ``num_ranks`` contiguous chunks (one per DP rank) has a similar token count.

    Responses to one prompt may land on different ranks; advantages were already computed, so nothing depends on
    group locality after this point.
    """
    if num_ranks == 1:
        return batch
    lengths = batch[Fields.ATTENTION_MASK].sum(dim=-1).tolist()
    parts = balance_across_ranks(lengths, num_ranks, equal_size=True)
    return batch.reorder(torch.tensor([index for part in parts for index in part]))


def trained_batch_metrics(batch: Batch, step: int) -> dict[str, float]:
    """A trained batch's metrics: scores, lengths and agent statistics of its episodes (an agent episode's other rows,
    ``agents/episode_rows.py``, left out: each episode counts once), its rows per episode, and the current weights'
    log-prob gap (``step``: the steps done)."""
    episodes = episodes_only(batch)
    return {**batch_metrics(episodes), **agent_metrics(episodes), **episode_rows_metrics(batch),
            **current_weights_log_prob_gap(batch, step)}


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Scores, rewards, advantages and lengths of a step's batch (means, with min/max for the key ones)."""
    response_mask = batch[Fields.RESPONSE_MASK].float()
    response_lengths = response_mask.sum(-1)
    prompt_lengths = batch[Fields.ATTENTION_MASK].sum(-1).float() - response_lengths
    scores = batch[Fields.TOKEN_LEVEL_SCORES].sum(-1)
    rewards = batch[Fields.TOKEN_LEVEL_REWARDS].sum(-1)
    max_length = batch[Fields.RESPONSES].shape[-1]
    metrics = {
        "critic/score/mean": float(scores.mean()), "critic/score/max": float(scores.max()),
        "critic/score/min": float(scores.min()), "critic/rewards/mean": float(rewards.mean()),
        "critic/advantages/mean": float(masked_mean(batch[Fields.ADVANTAGES], response_mask)),
        "critic/advantages/max": _extreme(batch[Fields.ADVANTAGES][response_mask.bool()], torch.max),
        "critic/advantages/min": _extreme(batch[Fields.ADVANTAGES][response_mask.bool()], torch.min),
        "response_length/mean": float(response_lengths.mean()), "response_length/max": float(response_lengths.max()),
        "response_length/clip_ratio": float((response_lengths >= max_length).float().mean()),
        "prompt_length/mean": float(prompt_lengths.mean()),
    }
    if Fields.VALUES in batch:
        metrics["critic/values/mean"] = float(masked_mean(batch[Fields.VALUES], response_mask))
    if Fields.ROLLOUT_LOG_PROBS in batch and Fields.OLD_LOG_PROBS in batch:
        difference = (batch[Fields.ROLLOUT_LOG_PROBS] - batch[Fields.OLD_LOG_PROBS]).abs() * response_mask
        metrics["rollout/log_prob_diff_max"] = float(difference.max())
        metrics["rollout/log_prob_diff_mean"] = float(difference.sum() / response_mask.sum().clamp_min(1))
    if batch.meta.get("routing_agreement") is not None:  # actor.router_replay: the old-log-prob pass's routers
        metrics["actor/routing_agreement"] = float(batch.meta["routing_agreement"])
    return metrics


def _extreme(values: torch.Tensor, reduce) -> float:
    """``reduce(values)`` as a float; 0.0 for no values (a batch without a response token: every episode failed
    before the model's first turn) — a metric, never the reason a step crashes."""
    return float(reduce(values)) if values.numel() else 0.0


def current_weights_log_prob_gap(batch: Batch, step: int) -> dict[str, float]:
    """Partial rollout: ``rollout/log_prob_diff_max_current`` — the largest gap between the engine's and the
    trainer's log-probs over the tokens generated with the weights being trained (``token_policy_versions ==
    step``): the log-prob gate for tokens produced after new weights landed mid-generation. Empty without them."""
    if Fields.TOKEN_POLICY_VERSIONS not in batch or Fields.OLD_LOG_PROBS not in batch:
        return {}
    current = batch[Fields.TOKEN_POLICY_VERSIONS] == step
    if not bool(current.any()):
        return {}
    gap = (batch[Fields.ROLLOUT_LOG_PROBS] - batch[Fields.OLD_LOG_PROBS]).abs()[current]
    return {"rollout/log_prob_diff_max_current": float(gap.max()),
            "rollout/current_weight_tokens": float(current.sum())}
