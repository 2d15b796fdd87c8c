"""The value model's engine on one rank: values of response states and clipped value-loss updates.

Same accumulation loop as the actor (``accumulation.py``): global normalisation, gradients reduced once per step or
per micro-batch (``critic.fsdp.grad_sync``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms import value_loss
from hybridrl.config.schema import CriticConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.engines.accumulation import (
    DataParallelGroup,
    MicroBatching,
    forward_micro_batches,
    train_epochs,
)
from hybridrl.modeling.sequences import response_values


@dataclass(frozen=True)
class ValueLossSettings:
    """The critic loss's settings (from ``CriticConfig`` and the data config)."""

    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: Optional[float] = None

    @classmethod
    def from_config(cls, critic: CriticConfig, max_response_length: int) -> "ValueLossSettings":
        return cls(cliprange_value=critic.cliprange_value, loss_agg_mode=critic.loss_agg_mode,
                   loss_scale_factor=float(max_response_length))


class ValueEngine:
    """Values and updates for one value model (``AutoModelForTokenClassification`` with one label) on one rank.

    Args:
        model: the value model, already sharded (or a plain module on a single process).
        dp: this rank's data-parallel group.
        packed: forward without pad tokens (``model.use_remove_padding``).
        share_prompts: run the responses to one prompt over a single copy of it (``model.share_prompts``).
        optimizer, scheduler: from ``hybridrl.engines.optim`` (``None`` for values only, no updates).
        grad_clip: maximum global gradient norm (``critic.grad_clip``).
    """

    def __init__(self, model: nn.Module, *, dp: DataParallelGroup, packed: bool = False, share_prompts: bool = False,
                 optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None, grad_clip: float = 1.0) -> None:
        self.model = model
        self.dp = dp
        self.packed = packed
        self.share_prompts = share_prompts
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip

    def compute_values(self, data: Batch, micro_batching: MicroBatching) -> Batch:
        """A Batch with ``values [B, R]``: the value of the state before each response token."""
        response_length = data[Fields.RESPONSES].shape[-1]
        return forward_micro_batches(self.model, data, micro_batching, self.dp, lambda micro_batch: {
            Fields.VALUES: response_values(self.model, micro_batch[Fields.INPUT_IDS],
                                           micro_batch[Fields.ATTENTION_MASK], response_length, packed=self.packed,
                                           share_prompts=self.share_prompts)})

    def micro_batch_loss(self, settings: ValueLossSettings):
        """The clipped value loss of one micro-batch (see ``accumulation.MicroBatchLoss``)."""

        def loss_fn(micro_batch: Batch, normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            response_mask = micro_batch[Fields.RESPONSE_MASK]
            predictions = response_values(self.model, micro_batch[Fields.INPUT_IDS],
                                          micro_batch[Fields.ATTENTION_MASK], response_mask.shape[-1],
                                          packed=self.packed, share_prompts=self.share_prompts)
            loss, metrics = value_loss(predictions, micro_batch[Fields.VALUES], micro_batch[Fields.RETURNS],
                                       response_mask, settings.cliprange_value, settings.loss_agg_mode,
                                       normalizer=normalizer, loss_scale_factor=settings.loss_scale_factor)
            return loss, {name: float(value) for name, value in metrics.items()}

        return loss_fn

    def update_critic(self, data: Batch, settings: ValueLossSettings, micro_batching: MicroBatching, *,
                      local_mini_batch_size: int, epochs: int = 1, shuffle: bool = False, seed: int = 0) -> dict:
        """Value-loss epochs over this rank's data (``values`` = old values, ``returns`` = targets)."""
        if self.optimizer is None:
            raise RuntimeError("this ValueEngine has no optimizer")
        return train_epochs(self.model, self.optimizer, self.scheduler, data, self.micro_batch_loss(settings),
                            loss_agg_mode=settings.loss_agg_mode, micro_batching=micro_batching, dp=self.dp,
                            grad_clip=self.grad_clip, local_mini_batch_size=local_mini_batch_size, epochs=epochs,
                            shuffle=shuffle, seed=seed, group_prompts=self.share_prompts and not self.packed)
