"""The reward model's training engine on one rank: pair rewards and Bradley–Terry updates of a sequence classifier.

No Ray here (like ``actor.py``): the Ray worker (``rm_train_worker.py``) owns one per process, and the invariance
tests drive it directly in gloo process groups. The accumulation loop is the actor's (``accumulation.py``) with the
``pair-mean`` normaliser: the global pair count of the mini-batch, gradients reduced once, on the last micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms.preference import bradley_terry_loss
from hybridrl.data.preference import PairFields
from hybridrl.protocol import Batch
from hybridrl.engines.accumulation import (
    PAIR_MEAN,
    DataParallelGroup,
    MicroBatching,
    forward_micro_batches,
    train_mini_batch,
)
from hybridrl.autotune.grad_noise import NoiseScaleMonitor
from hybridrl.modeling.sequences import sequence_scores


@dataclass(frozen=True)
class PreferenceLossSettings:
    """The Bradley–Terry loss's settings (``RMLossConfig``): constant margin and centring coefficient."""

    margin: float = 0.0
    center_coef: float = 0.0


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


class PreferenceEngine:
    """Rewards and Bradley–Terry updates for one reward model (one-label sequence classifier) on one rank.

    Args:
        model: the sequence classifier, already sharded (or a plain module on a single process).
        dp: this rank's data-parallel group.
        packed: forward without pad tokens (``model.use_remove_padding``).
        optimizer, scheduler: from ``hybridrl.engines.optim`` (``None`` to score only).
        grad_clip: maximum global gradient norm.
        grad_noise_scale: measure each micro-batch's gradient and log the noise scale.
    """

    def __init__(self, model: nn.Module, *, dp: DataParallelGroup, packed: bool = False,
                 optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None, grad_clip: float = 1.0,
                 grad_noise_scale: bool = False) -> None:
        self.model = model
        self.dp = dp
        self.packed = packed
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip
        self.noise_monitor = NoiseScaleMonitor(model, dp) if grad_noise_scale else None

    def micro_batch_loss(self, settings: PreferenceLossSettings):
        """The Bradley–Terry loss of one pair micro-batch (see ``accumulation.MicroBatchLoss``)."""

        def loss_fn(micro_batch: Batch, normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            chosen, rejected = pair_rewards(self.model, micro_batch, packed=self.packed)
            margin = micro_batch[PairFields.MARGIN] + settings.margin
            loss, metrics = bradley_terry_loss(chosen, rejected, normalizer=normalizer, margin=margin,
                                               center_coef=settings.center_coef)
            return loss, {name: float(value) for name, value in metrics.items()}

        return loss_fn

    def update(self, data: Batch, settings: PreferenceLossSettings, micro_batch_size: int, *,
               grad_sync: str = "step") -> dict[str, float]:
        """One optimizer step over this rank's pairs (its share of the mini-batch), ``micro_batch_size`` pairs per
        forward/backward, gradients reduced per step or per micro-batch (``grad_sync``: ``fsdp.grad_sync``).
        Returns the mini-batch's metrics (loss summed, the rest pair-weighted means over ranks)."""
        if self.optimizer is None:
            raise RuntimeError("this PreferenceEngine has no optimizer")
        self.model.train()
        loss_fn = self.micro_batch_loss(settings)
        if self.noise_monitor is not None:
            loss_fn = self.noise_monitor.wrap(loss_fn, PAIR_MEAN)
        metrics = train_mini_batch(self.model, self.optimizer, self.scheduler, data, loss_fn, loss_agg_mode=PAIR_MEAN,
                                   micro_batching=MicroBatching(micro_batch_size=micro_batch_size,
                                                                grad_sync=grad_sync),
                                   dp=self.dp, grad_clip=self.grad_clip)
        if self.noise_monitor is not None:
            metrics.update(self.noise_monitor.after_step(metrics))
        return metrics

    def compute_rewards(self, data: Batch, micro_batch_size: int) -> Batch:
        """``chosen_rewards [B]`` and ``rejected_rewards [B]`` of this rank's pairs (no gradients, eval mode)."""

        def forward(micro_batch: Batch) -> dict[str, torch.Tensor]:
            chosen, rejected = pair_rewards(self.model, micro_batch, packed=self.packed)
            return {PairFields.CHOSEN_REWARDS: chosen, PairFields.REJECTED_REWARDS: rejected}

        return forward_micro_batches(self.model, data, MicroBatching(micro_batch_size=micro_batch_size), self.dp,
                                     forward)
