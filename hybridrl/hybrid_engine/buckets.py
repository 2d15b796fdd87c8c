"""Bucket packing: group consecutive parameters so that no rank holds more than ``bucket_bytes`` of transfer buffers.

A parameter's *footprint* on a rank is the memory the executor allocates for it there (wire dtype):

* plan (point-to-point) path: the rank's output slice (received and local pieces land in it directly) plus one
  staging copy of each distinct box it sends that is not already in its own output (counted even when the
  executor can send a view of the local shard instead, i.e. when no cast is needed);
* gather path (``t_g = 1``): the full parameter padded to ``N·ceil(R/N)`` rows (the all-gather writes in place).

Buckets are packed greedily in parameter order: a parameter joins the open bucket if every rank's total stays
``≤ bucket_bytes``, else it opens the next one. A parameter whose footprint alone exceeds ``bucket_bytes`` gets a
bucket of its own, so the peak on any rank is ``≤ max(bucket_bytes, largest single-parameter footprint)``.
All ranks compute the same buckets from the same plan, which is what keeps their communication calls matched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from hybridrl.hybrid_engine.plan import ParamPlan, ReshardPlan, box_numel

Footprint = Callable[[ParamPlan], tuple[int, ...]]
"""``footprint(param_plan) -> bytes per rank`` (index = rank)."""


@dataclass(frozen=True)
class Bucket:
    """Indices (into ``plan.params``) of consecutive parameters moved together, and each rank's bytes for them."""

    param_indices: tuple[int, ...]
    bytes_per_rank: tuple[int, ...]

    @property
    def peak_bytes(self) -> int:
        return max(self.bytes_per_rank)


def p2p_footprint(plan: ReshardPlan) -> Footprint:
    """Per-rank bytes of the plan path for one parameter: output slice + distinct staged send boxes."""
    itemsize = plan.wire_dtype.itemsize

    def footprint(param: ParamPlan) -> tuple[int, ...]:
        per_rank = [box_numel(region) * itemsize for region in param.dst_regions]
        staged = {(transfer.src_rank, transfer.region) for transfer in param.transfers if transfer.is_local}
        for transfer in param.transfers:
            key = (transfer.src_rank, transfer.region)
            if not transfer.is_local and key not in staged:
                staged.add(key)
                per_rank[transfer.src_rank] += transfer.nbytes
        return tuple(per_rank)

    return footprint


def gather_footprint(plan: ReshardPlan) -> Footprint:
    """Per-rank bytes of the gather path for one parameter: its full size padded to whole FSDP chunks."""
    itemsize, n = plan.wire_dtype.itemsize, plan.world_size

    def footprint(param: ParamPlan) -> tuple[int, ...]:
        rows = param.meta.shape[0]
        padded_rows = -(-rows // n) * n
        nbytes = padded_rows * math.prod(param.meta.shape[1:]) * itemsize
        return (nbytes,) * n

    return footprint


def pack_buckets(plan: ReshardPlan, bucket_bytes: int, footprint: Footprint) -> list[Bucket]:
    """Greedy packing in parameter order (see the module docstring). ``bucket_bytes`` must be positive."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    buckets: list[Bucket] = []
    indices: list[int] = []
    totals = [0] * plan.world_size
    for index, param in enumerate(plan.params):
        cost = footprint(param)
        if indices and max(total + extra for total, extra in zip(totals, cost)) > bucket_bytes:
            buckets.append(Bucket(tuple(indices), tuple(totals)))
            indices, totals = [], [0] * plan.world_size
        indices.append(index)
        totals = [total + extra for total, extra in zip(totals, cost)]
    if indices:
        buckets.append(Bucket(tuple(indices), tuple(totals)))
    return buckets


def bucket_bound(buckets: Sequence[Bucket], bucket_bytes: int) -> int:
    """The peak any rank may reach: ``bucket_bytes``, or a lone oversized parameter's footprint if larger."""
    return max([bucket_bytes, *(bucket.peak_bytes for bucket in buckets if len(bucket.param_indices) == 1)])


def bucket_bytes_from_mb(weight_sync_bucket_mb: float) -> int:
    """``rollout.weight_sync_bucket_mb`` (MiB) → bytes."""
    return int(weight_sync_bucket_mb * (1 << 20))
