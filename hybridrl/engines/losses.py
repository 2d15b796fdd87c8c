"""The losses a training engine backpropagates, one small object per trained role, and their normalisers.

A loss is called on one micro-batch with the **global** normaliser of its mini-batch — the valid tokens, sequences
or pairs of the whole mini-batch over every micro-batch and every data-parallel rank (:func:`global_normalizer`) —
and returns ``(loss, metrics)``: the micro-batch's *share* of the mini-batch loss, so the shares of all micro-batches
on all ranks sum to the loss of one big batch. ``agg_mode`` says what the normaliser counts.

- :class:`PolicyLoss` — PPO-style clipped policy loss (``actor.policy_loss``), entropy bonus, KL loss;
- :class:`SFTLoss` — negative log-likelihood of the response tokens (SFT, PPO-ptx, EWC's Fisher);
- :class:`ValueLoss` — the critic's clipped value loss;
- :class:`BradleyTerryLoss` — reward-model training on (chosen, rejected) pairs;
- :class:`Scaled` — ``coef × loss`` with its metrics renamed (PPO-ptx's term).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Optional, Protocol

import torch
from torch import nn

from hybridrl.algorithms import POLICY_LOSSES, aggregate_loss, kl_penalty, loss_normalizer, masked_mean, value_loss
from hybridrl.algorithms.preference import bradley_terry_loss
from hybridrl.config.rm_schema import RMLossConfig
from hybridrl.config.schema import ActorConfig, CriticConfig
from hybridrl.data.preference import PairFields
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.modeling.sequences import response_log_probs, response_values, sequence_scores
from hybridrl.protocol import Batch, Fields

PAIR_MEAN = "pair-mean"
"""The ``agg_mode`` of preference losses: a mean over rows, each row one (chosen, rejected) pair, so the normaliser
is the global pair count. Pair batches carry no ``response_mask``."""

ADDITIVE_METRICS = frozenset({"pg_loss", "vf_loss", "loss", "nll", "desirable_reward", "undesirable_reward",
                              "reward_gap"})
"""Metrics that are each micro-batch's share of the mini-batch loss (or of a term of it: ORPO's ``nll``), or of a
step-normalised mean (KTO's per-label rewards): summed over micro-batches, not averaged."""


def local_normalizer(batch: Batch, agg_mode: str) -> torch.Tensor:
    """This batch's share of the normaliser: valid tokens or sequences (``response_mask``), or rows for ``pair-mean``."""
    if agg_mode == PAIR_MEAN:
        return torch.tensor(len(batch), dtype=torch.int64)
    return loss_normalizer(batch[Fields.RESPONSE_MASK], agg_mode)


def global_normalizer(batch: Batch, agg_mode: str, dp: DataParallelGroup) -> torch.Tensor:
    """The mini-batch's loss normaliser: valid tokens, sequences or pairs of this rank's part, summed over DP ranks
    (a 0-d float64 tensor; one all-reduce)."""
    count = local_normalizer(batch, agg_mode).to(torch.float64).reshape(1)
    return dp.sum(count).reshape(())


def metric_weight(batch: Batch, agg_mode: str) -> float:
    """Weight of a micro-batch's mean metrics in the mini-batch mean: valid response tokens, or pairs."""
    if agg_mode == PAIR_MEAN:
        return float(len(batch))
    return float(batch[Fields.RESPONSE_MASK].sum())


class Loss(Protocol):
    """What :meth:`~hybridrl.engines.base.TrainingEngine.optimizer_step` calls on every micro-batch."""

    agg_mode: str
    """What the normaliser counts: an ``actor.loss_agg_mode`` (tokens or sequences) or :data:`PAIR_MEAN`."""

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """``(this micro-batch's share of the mini-batch loss, its metrics as floats)``."""

    def check_update(self, data: Batch, *, epochs: int, mini_batch_size: int) -> None:
        """Refuse (``ValueError``) an update this loss cannot be right for, before its first step."""


class NoUpdateChecks:
    """For losses that are right for any update: ``check_update`` does nothing."""

    def check_update(self, data: Batch, *, epochs: int, mini_batch_size: int) -> None:
        return None


@dataclass(frozen=True)
class SequenceForward:
    """How prompt + response rows go through a model (:mod:`hybridrl.modeling.sequences`): ``packed`` without pad
    tokens (``model.use_remove_padding``), ``share_prompts`` one copy of a prompt for all its responses, ``fused_head``
    log-probs from the hidden states without ``[tokens, vocab]`` logits (``model.use_fused_kernels``),
    ``routes_by_record``: each token to the experts the rollout routed it to (``actor.router_replay.mode``)."""

    packed: bool = False
    share_prompts: bool = False
    fused_head: bool = False
    routes_by_record: bool = False

    @property
    def groups_prompts(self) -> bool:
        """Whether shuffled mini-batches are put back in prompt order, so micro-batches hold whole groups."""
        return self.share_prompts and not self.packed

    def log_probs(self, model: nn.Module, batch: Batch, *, temperature: float, with_entropy: bool = False,
                  entropy_grad: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(log_probs [B, R], entropy [B, R] or None)`` of ``batch``'s responses (nats, at ``temperature``)."""
        return response_log_probs(model, batch[Fields.INPUT_IDS], batch[Fields.ATTENTION_MASK],
                                  batch[Fields.RESPONSE_MASK].shape[-1], temperature=temperature, packed=self.packed,
                                  share_prompts=self.share_prompts, with_entropy=with_entropy,
                                  entropy_grad=entropy_grad, fused_head=self.fused_head,
                                  routed_experts=self._routing(batch), multi_modal=_images(batch))

    def _routing(self, batch: Batch) -> Optional[torch.Tensor]:
        """The rows' recorded experts when this forward replays routing and ``batch`` has them (SFT rows mixed into
        an update, ``actor.ptx``, have none: they route on their own)."""
        return batch[Fields.ROUTED_EXPERTS] if self.routes_by_record and Fields.ROUTED_EXPERTS in batch else None

    def values(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Critic values ``[B, R]`` of the state before each response token."""
        if _images(batch) is not None:
            raise ValueError("a critic (value model) does not read images yet: train a vision-language policy with a "
                             "critic-free estimator (algorithm=grpo, rloo, …)")
        return response_values(model, batch[Fields.INPUT_IDS], batch[Fields.ATTENTION_MASK],
                               batch[Fields.RESPONSE_MASK].shape[-1], packed=self.packed,
                               share_prompts=self.share_prompts)


def _images(batch: Batch) -> Optional[Sequence]:
    """The rows' image inputs (``Fields.MULTI_MODAL_INPUTS``), or ``None`` for text rows."""
    return batch.non_tensors.get(Fields.MULTI_MODAL_INPUTS)


@dataclass(frozen=True)
class PolicyLoss:
    """The actor's loss: ``POLICY_LOSSES[actor.policy_loss]`` on the ratio to ``old_log_probs`` (or, exactly
    on-policy, to its own log-probs detached), minus ``actor.entropy_coeff`` × entropy, plus ``actor.kl_loss_coef`` ×
    KL to the reference. Every term is aggregated with the same ``actor.loss_agg_mode`` and global normaliser.

    ``actor``: the ``actor.*`` config (its clip ratios, coefficients and modes; the config's defaults are the only
    ones). ``temperature``: the one the rollout sampled at (log-probs must be of that distribution).
    ``loss_scale_factor``: the constant horizon of ``seq-mean-token-sum-norm`` (the maximum response length).
    """

    forward: SequenceForward
    temperature: float
    actor: ActorConfig = field(default_factory=ActorConfig)
    loss_scale_factor: Optional[float] = None

    @classmethod
    def from_config(cls, actor: ActorConfig, max_response_length: int, *, forward: SequenceForward,
                    temperature: float) -> "PolicyLoss":
        return cls(forward=forward, temperature=temperature, actor=actor, loss_scale_factor=float(max_response_length))

    @property
    def agg_mode(self) -> str:
        return self.actor.loss_agg_mode

    def check_update(self, data: Batch, *, epochs: int, mini_batch_size: int) -> None:
        """Without ``old_log_probs`` the loss uses its own log-probs, detached, as π_old: only right when the update
        is exactly on-policy — one epoch over one mini-batch. Anything else is refused."""
        if Fields.OLD_LOG_PROBS not in data and (epochs != 1 or mini_batch_size != len(data)):
            raise ValueError(f"no old_log_probs: only an on-policy update (one epoch over one mini-batch) may use its "
                             f"own log-probs, but this one has {epochs} epoch(s) over mini-batches of "
                             f"{mini_batch_size} of {len(data)} rows")

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        actor, response_mask = self.actor, micro_batch[Fields.RESPONSE_MASK]
        log_prob, entropy = self.forward.log_probs(model, micro_batch, temperature=self.temperature,
                                                   with_entropy=True, entropy_grad=actor.entropy_coeff != 0)
        aggregate = dict(response_mask=response_mask, mode=actor.loss_agg_mode, normalizer=normalizer,
                         loss_scale_factor=self.loss_scale_factor)
        # Without old log-probs the update is exactly on-policy (check_update refused anything else): π_old = π_θ.
        old_log_prob = micro_batch[Fields.OLD_LOG_PROBS] if Fields.OLD_LOG_PROBS in micro_batch else log_prob.detach()
        advantages = micro_batch[Fields.ADVANTAGES]
        if Fields.IS_WEIGHTS in micro_batch:  # w ≥ 0 and every policy loss is positively homogeneous in A: the
            advantages = advantages * micro_batch[Fields.IS_WEIGHTS]  # per-token loss becomes exactly w × loss
        loss, metrics = POLICY_LOSSES[actor.policy_loss](
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
            response_mask=response_mask, clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high,
            clip_ratio_c=actor.clip_ratio_c, loss_agg_mode=actor.loss_agg_mode, normalizer=normalizer,
            loss_scale_factor=self.loss_scale_factor)
        metrics = {name: float(value) for name, value in metrics.items()}
        metrics["entropy"] = float(masked_mean(entropy.detach(), response_mask))
        if actor.entropy_coeff != 0:
            loss = loss - actor.entropy_coeff * aggregate_loss(entropy, **aggregate)
        if actor.use_kl_loss:
            kl = kl_penalty(log_prob, micro_batch[Fields.REF_LOG_PROBS], actor.kl_loss_type)
            loss = loss + actor.kl_loss_coef * aggregate_loss(kl, **aggregate)
            metrics["kl_loss"] = float(masked_mean(kl.detach(), response_mask))
        return loss, metrics


@dataclass(frozen=True)
class SFTLoss(NoUpdateChecks):
    """Negative log-likelihood of the response tokens, token-mean over the whole mini-batch (global normaliser), so
    supervised accumulation is exact too."""

    forward: SequenceForward
    agg_mode: str = "token-mean"

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        response_mask = micro_batch[Fields.RESPONSE_MASK]
        log_prob, _ = self.forward.log_probs(model, micro_batch, temperature=1.0)
        loss = aggregate_loss(-log_prob, response_mask, "token-mean", normalizer=normalizer)
        return loss, {"sft_loss": float(masked_mean(-log_prob.detach(), response_mask))}


@dataclass(frozen=True)
class ValueLoss(NoUpdateChecks):
    """The critic's clipped value loss against ``returns`` (``values`` = the values the rollout step computed), with
    ``critic.cliprange_value`` and ``critic.loss_agg_mode``."""

    forward: SequenceForward
    critic: CriticConfig = field(default_factory=CriticConfig)
    loss_scale_factor: Optional[float] = None

    @classmethod
    def from_config(cls, critic: CriticConfig, max_response_length: int, *,
                    forward: SequenceForward) -> "ValueLoss":
        return cls(forward=forward, critic=critic, loss_scale_factor=float(max_response_length))

    @property
    def agg_mode(self) -> str:
        return self.critic.loss_agg_mode

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        predictions = self.forward.values(model, micro_batch)
        loss, metrics = value_loss(predictions, micro_batch[Fields.VALUES], micro_batch[Fields.RETURNS],
                                   micro_batch[Fields.RESPONSE_MASK], self.critic.cliprange_value,
                                   self.critic.loss_agg_mode, normalizer=normalizer,
                                   loss_scale_factor=self.loss_scale_factor)
        return loss, {name: float(value) for name, value in metrics.items()}


def pair_rewards(model: nn.Module, pairs: Batch, *, packed: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(chosen [b], rejected [b])`` rewards of a pair micro-batch from **one** forward of its ``2b`` sequences.

    Padded: chosen and rejected rows are stacked into ``[2b, T]`` (each row its own sequence: the attention mask keeps
    them apart). Packed: the real tokens of all ``2b`` sequences form one row with per-sequence position ids, so the
    causal mask is block-diagonal — no attention between a chosen response and its rejected twin.
    """
    input_ids = torch.cat([pairs[PairFields.CHOSEN_INPUT_IDS], pairs[PairFields.REJECTED_INPUT_IDS]])
    attention_mask = torch.cat([pairs[PairFields.CHOSEN_ATTENTION_MASK], pairs[PairFields.REJECTED_ATTENTION_MASK]])
    scores = sequence_scores(model, input_ids, attention_mask, packed=packed)
    return scores[:len(pairs)], scores[len(pairs):]


@dataclass(frozen=True)
class BradleyTerryLoss(NoUpdateChecks):
    """``−log σ(r_chosen − r_rejected − margin)`` per pair (the row's ``margin`` plus ``loss.margin``), with an
    optional centring term ``loss.center_coef · (r_chosen + r_rejected)²`` (``loss``: the RM trainer's ``loss.*``)."""

    packed: bool = False
    loss: RMLossConfig = field(default_factory=RMLossConfig)
    agg_mode: str = PAIR_MEAN

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        chosen, rejected = pair_rewards(model, micro_batch, packed=self.packed)
        loss, metrics = bradley_terry_loss(chosen, rejected, normalizer=normalizer,
                                           margin=micro_batch[PairFields.MARGIN] + self.loss.margin,
                                           center_coef=self.loss.center_coef)
        return loss, {name: float(value) for name, value in metrics.items()}


@dataclass(frozen=True)
class Scaled:
    """``coef × loss`` with its metrics renamed ``{prefix}{name}`` (PPO-ptx's SFT term: ``ptx/sft_loss``)."""

    loss: Loss
    coef: float
    prefix: str

    @property
    def agg_mode(self) -> str:
        return self.loss.agg_mode

    def check_update(self, data: Batch, *, epochs: int, mini_batch_size: int) -> None:
        self.loss.check_update(data, epochs=epochs, mini_batch_size=mini_batch_size)

    def __call__(self, model: nn.Module, micro_batch: Batch,
                 normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        value, metrics = self.loss(model, micro_batch, normalizer)
        return self.coef * value, {f"{self.prefix}{name}": metric for name, metric in metrics.items()}
