"""No-grad passes of a training engine over a whole batch: log-probs, values, pair rewards, pair log-probs.

Each runs :meth:`~hybridrl.engines.base.TrainingEngine.forward` over the batch's micro-batches (eval mode, parameters
gathered once per pass with ``gather_once``) and returns a :class:`~hybridrl.protocol.Batch` in the input's row order.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridrl.data.preference import PairFields
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import SequenceForward, pair_rewards
from hybridrl.engines.micro_batches import MicroBatching
from hybridrl.engines.preference_losses import pair_log_probs
from hybridrl.protocol import Batch, Fields


def log_probs(engine: TrainingEngine, data: Batch, micro_batching: MicroBatching, forward: SequenceForward, *,
              temperature: float, with_entropy: bool = True) -> Batch:
    """``old_log_probs [B, R]`` (nats, at the rollout's ``temperature``) of ``data``'s responses, and ``entropy``
    unless ``with_entropy=False``."""

    def outputs_of(micro_batch: Batch) -> dict[str, torch.Tensor]:
        log_prob, entropy = forward.log_probs(engine.model, micro_batch, temperature=temperature,
                                              with_entropy=with_entropy)
        return {Fields.OLD_LOG_PROBS: log_prob, **({Fields.ENTROPY: entropy} if with_entropy else {})}

    return engine.forward(data, micro_batching, outputs_of)


def values(engine: TrainingEngine, data: Batch, micro_batching: MicroBatching, forward: SequenceForward) -> Batch:
    """``values [B, R]``: the value model's estimate of the state before each response token."""
    return engine.forward(data, micro_batching,
                          lambda micro_batch: {Fields.VALUES: forward.values(engine.model, micro_batch)})


def pair_log_probs_of(engine: TrainingEngine, pairs: Batch, micro_batching: MicroBatching, response_length: int,
                      names: Mapping[str, str], *, packed: bool) -> Batch:
    """Summed response log-probs ``[B]`` (float32) under ``engine``'s causal LM of the sides ``names`` maps to output
    fields (``{"chosen": …, "rejected": …}``, or one of them): the policy's or the reference's of ``hybridrl dpo``."""
    sides = tuple(side for side in ("chosen", "rejected") if side in names)

    def outputs_of(micro_batch: Batch) -> dict[str, torch.Tensor]:
        scored = pair_log_probs(engine.model, micro_batch, response_length, packed=packed, sides=sides)
        return {names[side]: getattr(scored, side).float() for side in sides}

    return engine.forward(pairs, micro_batching, outputs_of)


def pair_rewards_of(engine: TrainingEngine, pairs: Batch, micro_batching: MicroBatching, *, packed: bool) -> Batch:
    """``chosen_rewards [B]`` and ``rejected_rewards [B]`` of a reward model on preference pairs."""

    def outputs_of(micro_batch: Batch) -> dict[str, torch.Tensor]:
        chosen, rejected = pair_rewards(engine.model, micro_batch, packed=packed)
        return {PairFields.CHOSEN_REWARDS: chosen, PairFields.REJECTED_REWARDS: rejected}

    return engine.forward(pairs, micro_batching, outputs_of)
