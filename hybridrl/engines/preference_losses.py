"""Offline preference optimisation as an engine loss (``hybridrl dpo``): the policy's summed log-probs of both sides of
each pair from **one** forward, then DPO / cDPO / IPO / SimPO / ORPO / KTO
(``hybridrl.algorithms.preference_optimization``). KTO's rows (``hybridrl.data.unpaired``) are forwarded on their
completion side only: their KL side enters through the step's reference point ``z₀`` (``step_kl``), computed by the
trainer before the step.

A pair Batch (``hybridrl.data.preference``) is one row per pair, each side ``[B, P + R]`` with the response in the
last ``R`` columns. A pair's reference log-probs ride in the batch (``reference_*_log_probs``, computed by the
trainer before the step), so the loss reads no second model. The normaliser is the global pair count
(:data:`~hybridrl.engines.losses.PAIR_MEAN`): the shares of every micro-batch on every rank add up to one big batch's
loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from hybridrl.algorithms.preference_optimization import dpo_loss, ipo_loss, kto_loss, orpo_loss, simpo_loss
from hybridrl.config.dpo_schema import DPOLossConfig
from hybridrl.data.preference import PairFields
from hybridrl.engines.losses import PAIR_MEAN, NoUpdateChecks
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.protocol import Batch


@dataclass(frozen=True)
class PairLogProbs:
    """``[B]`` summed response log-probs of each side, and the sides' response lengths in tokens."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor


SIDES = ("chosen", "rejected")
_SIDE_FIELDS = {"chosen": (PairFields.CHOSEN_INPUT_IDS, PairFields.CHOSEN_ATTENTION_MASK),
                "rejected": (PairFields.REJECTED_INPUT_IDS, PairFields.REJECTED_ATTENTION_MASK)}


def pair_log_probs(model: nn.Module, pairs: Batch, response_length: int, *, packed: bool,
                   sides: tuple[str, ...] = SIDES) -> PairLogProbs:
    """The ``sides``' summed response log-probs under ``model`` (default both), from one forward of their sequences
    (packed: the real tokens of all of them in one row, attention kept within each); a side not asked for is zeros
    (KTO forwards its completion side alone for the loss, its KL side alone for ``z₀``)."""
    input_ids = torch.cat([pairs[_SIDE_FIELDS[side][0]] for side in sides])
    attention_mask = torch.cat([pairs[_SIDE_FIELDS[side][1]] for side in sides])
    log_probs, _ = response_log_probs(model, input_ids, attention_mask, response_length, packed=packed)
    sums = dict(zip(sides, log_probs.sum(-1).split(len(pairs))))
    lengths = dict(zip(sides, attention_mask[:, -response_length:].sum(-1).split(len(pairs))))
    zeros = torch.zeros(len(pairs), dtype=log_probs.dtype, device=log_probs.device)
    no_tokens = torch.zeros(len(pairs), dtype=attention_mask.dtype, device=attention_mask.device)
    return PairLogProbs(sums.get("chosen", zeros), sums.get("rejected", zeros), lengths.get("chosen", no_tokens),
                        lengths.get("rejected", no_tokens))


def response_lengths(pairs: Batch, response_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B]`` response tokens of the chosen and of the rejected side (the last ``response_length`` columns)."""
    return (pairs[PairFields.CHOSEN_ATTENTION_MASK][:, -response_length:].sum(-1),
            pairs[PairFields.REJECTED_ATTENTION_MASK][:, -response_length:].sum(-1))


@dataclass(frozen=True)
class PreferenceOptimizationLoss(NoUpdateChecks):
    """``loss.type`` of ``hybridrl dpo`` on a pair micro-batch: its share of the mini-batch loss and its metrics
    (``loss``, ``chosen_reward``, ``rejected_reward``, ``margin``, ``accuracy`` — the implicit rewards)."""

    response_length: int
    loss: DPOLossConfig = field(default_factory=DPOLossConfig)
    packed: bool = False
    agg_mode: str = PAIR_MEAN

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        policy = pair_log_probs(model, micro_batch, self.response_length, packed=self.packed,
                                sides=("chosen",) if self.loss.type == "kto" else SIDES)
        value, metrics = preference_loss(self.loss, policy, micro_batch, normalizer)
        return value, {"loss": float(value.detach()), **{name: float(item) for name, item in metrics.items()}}


def preference_loss(config: DPOLossConfig, policy: PairLogProbs, pairs: Batch,
                    normalizer: torch.Tensor | float) -> tuple[torch.Tensor, dict]:
    """``config.type`` on the policy's log-probs and, for the losses that read one, the reference's in ``pairs``.
    ORPO's likelihood term is normalised by the step's chosen tokens (``step_chosen_tokens``; without it, those of
    ``pairs``: a whole batch, as in validation)."""
    if config.type == "orpo":
        chosen_tokens = (pairs[PairFields.STEP_CHOSEN_TOKENS][0] if PairFields.STEP_CHOSEN_TOKENS in pairs
                         else policy.chosen_lengths.sum())
        return orpo_loss(policy.chosen, policy.rejected, policy.chosen_lengths, policy.rejected_lengths,
                         lam=config.beta, pair_normalizer=normalizer, token_normalizer=chosen_tokens)
    if config.type == "simpo":
        return simpo_loss(policy.chosen, policy.rejected, policy.chosen_lengths, policy.rejected_lengths,
                          beta=config.beta, gamma=config.simpo_gamma, normalizer=normalizer)
    reference = (pairs[PairFields.REFERENCE_CHOSEN_LOG_PROBS].to(policy.chosen.dtype),
                 pairs[PairFields.REFERENCE_REJECTED_LOG_PROBS].to(policy.chosen.dtype))
    if config.type == "ipo":  # on per-token means of the log-ratios: TRL's form, in which the IPO paper's results are
        chosen_length = policy.chosen_lengths.clamp_min(1).to(policy.chosen.dtype)
        rejected_length = policy.rejected_lengths.clamp_min(1).to(policy.chosen.dtype)
        return ipo_loss(policy.chosen / chosen_length, policy.rejected / rejected_length,
                        reference[0] / chosen_length, reference[1] / rejected_length, beta=config.beta,
                        normalizer=normalizer)
    if config.type == "kto":
        return kto_step_loss(config, policy.chosen, reference[0], pairs, normalizer)
    if config.type == "dpo":
        return dpo_loss(policy.chosen, policy.rejected, *reference, beta=config.beta, normalizer=normalizer,
                        label_smoothing=config.label_smoothing)
    raise ValueError(f"loss.type={config.type!r}: not a preference loss")


def kto_step_loss(config: DPOLossConfig, policy: torch.Tensor, reference: torch.Tensor, rows: Batch,
                  normalizer: torch.Tensor | float) -> tuple[torch.Tensor, dict]:
    """KTO on the completion side of ``rows`` with the step's reference point (``step_kl``). Metrics, each this
    micro-batch's share of the step's value (summed over micro-batches and ranks, so no split changes them):
    ``desirable_reward`` / ``undesirable_reward``, the mean implicit reward ``β (π − ρ)`` of each label's rows
    (``step_label_counts``), and ``reward_gap``, their difference; ``reference_point`` is ``z₀``."""
    desirable = rows[PairFields.DESIRABLE] > 0.5
    value, metrics = kto_loss(policy, reference, desirable, beta=config.beta,
                              reference_point=rows[PairFields.STEP_KL][0], normalizer=normalizer,
                              desirable_weight=config.desirable_weight, undesirable_weight=config.undesirable_weight)
    rewards = config.beta * (policy - reference).detach()
    counts = rows[PairFields.STEP_LABEL_COUNTS][0].to(rewards.dtype).clamp_min(1)
    desirable_share = (rewards * desirable).sum() / counts[0]
    undesirable_share = (rewards * ~desirable).sum() / counts[1]
    return value, {"desirable_reward": desirable_share, "undesirable_reward": undesirable_share,
                   "reward_gap": desirable_share - undesirable_share, "reference_point": metrics["reference_point"]}
