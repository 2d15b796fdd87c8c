"""How a rank cuts its data: mini-batches (one optimizer step each) and micro-batches (one forward/backward each).

A training step's rows on one rank are cut into ``local_mini_batch_size`` mini-batches (shuffled per PPO epoch); each
mini-batch into micro-batches of a fixed number of sequences or of at most ``max_tokens`` tokens (balanced by
Karmarkar–Karp). Every rank cuts the same number of micro-batches: FSDP2's collectives need equal call counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from hybridrl.config.validation import GRAD_SYNC_MODES
from hybridrl.data.partition import partition_by_token_budget
from hybridrl.modeling.shared_prompts import prompts_together
from hybridrl.protocol import Batch


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
    per micro-batch (:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered`); ``defer_all_reduce``
    (``*.fsdp.defer_all_reduce``): HSDP's all-reduce across shard groups once per optimizer step, not after every
    reduce-scatter."""

    micro_batch_size: Optional[int] = None
    max_tokens: Optional[int] = None
    grad_sync: str = "step"
    gather_once: bool = False
    defer_all_reduce: bool = True

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
    ``attention_mask``) and the count is agreed across ranks.

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
        parts = partition_by_token_budget(lengths, max_tokens, min_num_micro_batches=most)
    raise RuntimeError("data-parallel ranks could not agree on a micro-batch count")


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
