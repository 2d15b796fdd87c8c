"""Gradient accumulation with exact global normalisation — the loop shared by actor, critic and reward-model training.

One optimizer step = one mini-batch. On each data-parallel rank the local part of the mini-batch is split into
micro-batches (a fixed count of sequences, or a token budget balanced by Karmarkar–Karp). Before the first
micro-batch, the mini-batch's **global** normaliser (valid tokens or sequences over all micro-batches and all ranks)
is all-reduced; every micro-batch loss is divided by it and multiplied by the DP size (FSDP2 averages gradients over
ranks, which turns that back into the sum), and gradients are reduced once, on the last micro-batch (``grad_sync=step``)
or after every micro-batch into the sharded gradients (``micro_batch``: less memory, more reduce-scatters). The
result equals one big batch on one device, which the invariance tests check against a plain PyTorch reference.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from hybridrl.algorithms import loss_normalizer
from hybridrl.data.partition import partition_by_token_budget
from hybridrl.protocol import Batch
from hybridrl.config.validation import GRAD_SYNC_MODES
from hybridrl.modeling.fsdp import parameters_kept_gathered, set_gradient_sync, syncs_gradients
from hybridrl.engines.optim import clipped_step
from hybridrl.modeling.shared_prompts import prompts_together

# (micro_batch, global_normalizer) -> (loss to backpropagate, metrics of this micro-batch as floats)
MicroBatchLoss = Callable[[Batch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class DataParallelGroup:
    """The data-parallel process group of a worker (``group=None`` and ``size=1`` for a single process)."""

    group: Optional[dist.ProcessGroup] = None
    rank: int = 0
    size: int = 1

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place all-reduce sum across DP ranks (a no-op on one rank); returns ``tensor``."""
        if self.size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def max_int(self, value: int) -> int:
        """The maximum of ``value`` over DP ranks."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return int(tensor.item())


@dataclass(frozen=True)
class MicroBatching:
    """How a rank cuts its part of a mini-batch: ``micro_batch_size`` sequences, or ``max_tokens`` per micro-batch;
    and when training reduces gradients across ranks: ``grad_sync`` (``*.fsdp.grad_sync``, see
    :func:`~hybridrl.modeling.fsdp.syncs_gradients`; forward-only passes ignore it); ``gather_once``
    (``*.fsdp.gather_once``): FSDP2 parameters all-gathered once for all the micro-batches of a step or pass, not
    per micro-batch (:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered`)."""

    micro_batch_size: Optional[int] = None
    max_tokens: Optional[int] = None
    grad_sync: str = "step"
    gather_once: bool = False

    def __post_init__(self) -> None:
        if (self.micro_batch_size is None) == (self.max_tokens is None):
            raise ValueError("MicroBatching needs exactly one of micro_batch_size or max_tokens")
        if self.grad_sync not in GRAD_SYNC_MODES:
            raise ValueError(f"MicroBatching.grad_sync must be one of {', '.join(GRAD_SYNC_MODES)}, "
                             f"got {self.grad_sync!r}")


def split_micro_batches(batch: Batch, micro_batching: MicroBatching,
                        dp: DataParallelGroup) -> tuple[list[Batch], Optional[torch.Tensor]]:
    """Cut ``batch`` (this rank's sequences) into micro-batches; every rank gets the same number of them.

    With a token budget, sequences are grouped by ``partition_by_token_budget`` (token counts from
    ``attention_mask``) and the count is agreed across ranks (FSDP collectives need equal call counts).

    Returns:
        ``(micro_batches, restore)``: ``restore`` is ``None`` when rows keep their order, else the permutation with
        ``concat(outputs)[restore]`` back in ``batch``'s row order.
    """
    if micro_batching.micro_batch_size is not None:
        return batch.split_every(micro_batching.micro_batch_size), None
    parts = token_budget_parts(batch, micro_batching.max_tokens, dp)
    order = torch.tensor([index for part in parts for index in part], dtype=torch.long)
    return [batch.index(part) for part in parts], torch.argsort(order)


def token_budget_parts(batch: Batch, max_tokens: int, dp: DataParallelGroup) -> list[list[int]]:
    """Row indices of each token-budget micro-batch, with the micro-batch count agreed across DP ranks."""
    lengths = batch["attention_mask"].sum(dim=-1).tolist()
    parts = partition_by_token_budget(lengths, max_tokens)
    for _ in range(8):  # more parts can, rarely, be needed at a larger count; agree again until stable
        most, fewest = dp.max_int(len(parts)), -dp.max_int(-len(parts))  # both collectives on every rank
        if most == fewest:
            return parts
        agreed = most
        parts = partition_by_token_budget(lengths, max_tokens, min_num_micro_batches=agreed)
    raise RuntimeError("data-parallel ranks could not agree on a micro-batch count")


PAIR_MEAN = "pair-mean"
"""The ``loss_agg_mode`` of preference losses (reward-model training): a mean over rows, each row one
(chosen, rejected) pair, so the normaliser is the global pair count. Pair batches carry no ``response_mask``."""


def local_normalizer(batch: Batch, loss_agg_mode: str) -> torch.Tensor:
    """This batch's share of the normaliser: valid tokens or sequences (``response_mask``), or rows for ``pair-mean``."""
    if loss_agg_mode == PAIR_MEAN:
        return torch.tensor(len(batch), dtype=torch.int64)
    return loss_normalizer(batch["response_mask"], loss_agg_mode)


def metric_weight(batch: Batch, loss_agg_mode: str) -> float:
    """Weight of a micro-batch's mean metrics in the mini-batch mean: valid response tokens, or pairs."""
    if loss_agg_mode == PAIR_MEAN:
        return float(len(batch))
    return float(batch["response_mask"].sum())


def global_normalizer(batch: Batch, loss_agg_mode: str, dp: DataParallelGroup) -> torch.Tensor:
    """The mini-batch's loss normaliser: valid tokens, sequences or pairs of this rank's part, summed over DP ranks."""
    count = local_normalizer(batch, loss_agg_mode).to(torch.float64).reshape(1)
    return dp.sum(count).reshape(())


# Metrics that are each micro-batch's *share* of the mini-batch loss (global normaliser): summed, not averaged.
ADDITIVE_METRICS = frozenset({"pg_loss", "vf_loss", "loss"})


def accumulate_gradients(model: nn.Module, mini_batch: Batch, loss_fn: MicroBatchLoss, *, loss_agg_mode: str,
                         micro_batching: MicroBatching, dp: DataParallelGroup) -> dict[str, float]:
    """Forward/backward every micro-batch of this rank's part of ``mini_batch``; gradients reduce on the last one
    (or on each, with ``micro_batching.grad_sync == "micro_batch"``).

    Returns metrics over the whole mini-batch: loss shares (``ADDITIVE_METRICS``) summed over micro-batches and
    ranks — the mini-batch loss itself — and every other metric averaged, weighted by valid response tokens (pairs
    under ``pair-mean``).
    """
    normalizer = global_normalizer(mini_batch, loss_agg_mode, dp)
    micro_batches, _ = split_micro_batches(mini_batch, micro_batching, dp)
    totals: dict[str, float] = {}
    weight_sum = 0.0
    with gathered_if(model, micro_batching.gather_once, through_backward=True):
        for index, micro_batch in enumerate(micro_batches):
            set_gradient_sync(model, syncs_gradients(micro_batching.grad_sync, index, len(micro_batches)))
            loss, metrics = loss_fn(micro_batch, normalizer)
            (loss * dp.size).backward()
            weight = metric_weight(micro_batch, loss_agg_mode)
            weight_sum += weight
            for name, value in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(value) * (1.0 if name in ADDITIVE_METRICS else weight)
    return reduce_over_ranks(totals, weight_sum, dp)


def gathered_if(model: nn.Module, enabled: bool, *, through_backward: bool = False):
    """:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered` when ``enabled``, else nothing."""
    return parameters_kept_gathered(model, through_backward=through_backward) if enabled else contextlib.nullcontext()


def reduce_over_ranks(totals: dict[str, float], weight: float, dp: DataParallelGroup) -> dict[str, float]:
    """Per-rank totals → global values in one small all-reduce: additive metrics summed, the rest turned from
    weighted sums into weighted means."""
    names = sorted(totals)
    packed = torch.tensor([totals[name] for name in names] + [weight], dtype=torch.float64)
    dp.sum(packed)
    denominator = max(float(packed[-1]), 1.0)
    return {name: float(packed[i]) / (1.0 if name in ADDITIVE_METRICS else denominator)
            for i, name in enumerate(names)}


def train_mini_batch(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, mini_batch: Batch,
                     loss_fn: MicroBatchLoss, *, loss_agg_mode: str, micro_batching: MicroBatching,
                     dp: DataParallelGroup, grad_clip: float,
                     before_step: Optional[Callable[[], dict[str, float]]] = None) -> dict[str, float]:
    """One optimizer step over ``mini_batch``: accumulate, clip, step (or skip on a non-finite gradient norm).

    ``before_step()`` runs between accumulation and clipping: it may add gradient terms of its own (a PPO-ptx SFT
    pass, an EWC penalty) and returns their metrics.
    """
    metrics = accumulate_gradients(model, mini_batch, loss_fn, loss_agg_mode=loss_agg_mode,
                                   micro_batching=micro_batching, dp=dp)
    if before_step is not None:
        metrics.update(before_step())
    result = clipped_step(model, optimizer, scheduler, grad_clip)
    metrics.update(grad_norm=result.grad_norm, lr=result.lr, skipped_step=float(not result.applied))
    return metrics


@torch.no_grad()
def forward_micro_batches(model: nn.Module, data: Batch, micro_batching: MicroBatching, dp: DataParallelGroup,
                          forward: Callable[[Batch], dict[str, torch.Tensor]]) -> Batch:
    """Run a no-grad ``forward(micro_batch) -> {name: [b, ...]}`` over ``data``'s micro-batches in eval mode and
    return the outputs as one Batch in ``data``'s row order (token-budget micro-batches are reordered back)."""
    was_training = model.training
    model.eval()
    try:
        micro_batches, restore = split_micro_batches(data, micro_batching, dp)
        with gathered_if(model, micro_batching.gather_once):
            outputs = [forward(micro_batch) for micro_batch in micro_batches]
    finally:
        model.train(was_training)
    merged = {name: torch.cat([output[name] for output in outputs]) for name in outputs[0]}
    return Batch(tensors={name: value if restore is None else value[restore] for name, value in merged.items()})


def train_epochs(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, data: Batch, loss_fn: MicroBatchLoss,
                 *, loss_agg_mode: str, micro_batching: MicroBatching, dp: DataParallelGroup, grad_clip: float,
                 local_mini_batch_size: int, epochs: int, shuffle: bool, seed: int, group_prompts: bool = False,
                 after_step: Optional[Callable[[dict[str, float]], dict[str, float]]] = None,
                 before_step: Optional[Callable[[int], dict[str, float]]] = None) -> dict[str, float]:
    """PPO-style epochs over this rank's data, one optimizer step per mini-batch; metrics averaged over steps.

    ``after_step(step_metrics)`` may add metrics of its own after each optimizer step (e.g. the noise scale);
    ``before_step(index)`` (index of the mini-batch within its epoch) may add gradient terms before the step.
    """
    model.train()
    per_step = []
    mini_batches = iterate_mini_batches(data, local_mini_batch_size, epochs=epochs, shuffle=shuffle, seed=seed,
                                        group_prompts=group_prompts)
    per_epoch = len(mini_batches) // max(epochs, 1)
    for index, mini_batch in enumerate(mini_batches):
        extra = None if before_step is None else functools.partial(before_step, index % per_epoch)
        metrics = train_mini_batch(model, optimizer, scheduler, mini_batch, loss_fn, loss_agg_mode=loss_agg_mode,
                                   micro_batching=micro_batching, dp=dp, grad_clip=grad_clip, before_step=extra)
        if after_step is not None:
            metrics.update(after_step(metrics))
        per_step.append(metrics)
    return average_metrics(per_step)


def iterate_mini_batches(data: Batch, local_mini_batch_size: int, *, epochs: int, shuffle: bool,
                         seed: int, group_prompts: bool = False) -> list[Batch]:
    """This rank's mini-batches for all PPO epochs, shuffled per epoch with a generator seeded by ``seed``.

    ``group_prompts``: after a shuffle, the rows of each mini-batch are put back next to the other responses to
    their prompt (:func:`~hybridrl.modeling.shared_prompts.prompts_together`), so micro-batches can share prompts.
    """
    mini_batches: list[Batch] = []
    for epoch in range(epochs):
        if shuffle:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            epoch_data = data.reorder(torch.randperm(len(data), generator=generator))
        else:
            epoch_data = data
        count = len(epoch_data) // local_mini_batch_size
        if count * local_mini_batch_size != len(epoch_data):
            raise ValueError(f"this rank holds {len(epoch_data)} sequences, not a multiple of the local mini-batch "
                             f"{local_mini_batch_size}; check the batch plan")
        parts = epoch_data.split([local_mini_batch_size] * count)
        mini_batches += [prompts_together(part) for part in parts] if shuffle and group_prompts else parts
    return mini_batches


def average_metrics(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over optimizer steps (``skipped_step`` is summed: it is a count)."""
    if not per_step:
        return {}
    names = {name for metrics in per_step for name in metrics}
    averaged = {name: sum(m.get(name, 0.0) for m in per_step) / len(per_step) for name in names}
    averaged["skipped_step"] = sum(m.get("skipped_step", 0.0) for m in per_step)
    return averaged
