"""The resharding plan, as data: who sends which box of which parameter to whom.

Source layout (training): FSDP2 shards every parameter over the ``N`` ranks on dim 0 with ``torch.chunk`` semantics —
rank ``r`` holds rows ``[min(r·c, R), min((r+1)·c, R))`` with ``c = ceil(R / N)``, so the last shards may be short or
empty. Destination layout (generation): ``N / t_g`` data-parallel replicas of a ``t_g``-way tensor-parallel group; the
``GenerationLayout`` says which TP rank each global rank is, and ``tp_rules`` which region a TP rank holds.

Because the source is a partition of rows, every element a destination needs lives on exactly one source rank, so the
plan is the set of non-empty intersections ``dst_region ∩ src_rows`` — each destination receives exactly its region
(zero redundancy: nothing it does not serve, nothing twice). A transfer with ``src == dst`` is a local copy.

Everything here is pure Python (``torch.dtype`` only for its item size); ``transfer.py`` executes a plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from hybridrl.hybrid_engine.tp_rules import Box, RuleFn, TpSlices, resolve_split
from hybridrl.utils.distributed import check_tp_size

LAYOUT_ORDERS = ("dp_major", "tp_major")


@dataclass(frozen=True)
class ParamMeta:
    """A training parameter: HF ``name``, full (unsharded) ``shape`` and master ``dtype``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GenerationLayout:
    """Placement of ``world_size`` ranks into ``world_size / tp_size`` replicas of a ``tp_size``-way TP group.

    ``dp_major`` (default) is the row-major ``[dp, tp]`` mesh of ``build_device_meshes``: replica ``d`` is ranks
    ``d·t_g .. d·t_g + t_g − 1`` (consecutive ranks, i.e. one node's NVLink domain, form a TP group).
    ``tp_major`` is HybridFlow's grouping (§5 "3D-HybridEngine"): TP rank ``j`` of every replica is taken from the
    ``j``-th block of ``N / t_g`` consecutive ranks, so each rank's FSDP row chunk lies inside its own column-parallel
    slice and the rank never receives what it already holds. It moves less data (see ``volume.py``).
    """

    world_size: int
    tp_size: int
    order: str = "dp_major"

    def __post_init__(self) -> None:
        check_tp_size(self.world_size, self.tp_size)
        if self.order not in LAYOUT_ORDERS:
            raise ValueError(f"layout order must be one of {LAYOUT_ORDERS}, got {self.order!r}")

    @property
    def num_replicas(self) -> int:
        return self.world_size // self.tp_size

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size if self.order == "dp_major" else rank // self.num_replicas

    def dp_rank(self, rank: int) -> int:
        return rank // self.tp_size if self.order == "dp_major" else rank % self.num_replicas

    def tp_group(self, dp_rank: int) -> list[int]:
        """Global ranks of replica ``dp_rank``'s TP group, in TP-rank order."""
        return sorted((r for r in range(self.world_size) if self.dp_rank(r) == dp_rank), key=self.tp_rank)


@dataclass(frozen=True)
class Transfer:
    """One box of one parameter moving from ``src_rank`` to ``dst_rank``.

    ``src_box`` is in the source's local FSDP shard coordinates, ``dst_box`` in the destination's slice
    coordinates, ``region`` in full-tensor coordinates; ``nbytes`` counts elements × the wire dtype's item size.
    """

    param: str
    src_rank: int
    dst_rank: int
    src_box: Box
    dst_box: Box
    region: Box
    nbytes: int

    @property
    def is_local(self) -> bool:
        return self.src_rank == self.dst_rank


@dataclass(frozen=True)
class ParamPlan:
    """The plan of one parameter: ``slices.boxes[tp_rank]`` per TP rank, FSDP ``src_rows[rank]``, the transfers."""

    meta: ParamMeta
    slices: TpSlices
    dst_regions: tuple[Box, ...]          # [rank] -> region of the full tensor this rank receives
    src_rows: tuple[tuple[int, int], ...]  # [rank] -> FSDP rows it holds
    transfers: tuple[Transfer, ...]

    def slice_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(stop - start for start, stop in self.dst_regions[rank])


@dataclass(frozen=True)
class ReshardPlan:
    """Plan of a whole model, in parameter order. ``wire_dtype`` is what moves and what the engine receives."""

    layout: GenerationLayout
    wire_dtype: torch.dtype
    params: tuple[ParamPlan, ...]

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def transfers(self) -> list[Transfer]:
        return [transfer for param in self.params for transfer in param.transfers]

    def total_bytes(self) -> int:
        """M: bytes of the whole model in the wire dtype."""
        return sum(param.meta.numel for param in self.params) * self.wire_dtype.itemsize


def fsdp_row_ranges(num_rows: int, world_size: int) -> tuple[tuple[int, int], ...]:
    """Rows each rank holds under FSDP2's ``Shard(0)`` (``torch.chunk`` semantics: short or empty tail shards)."""
    chunk = -(-num_rows // world_size) if num_rows else 0
    return tuple((min(r * chunk, num_rows), min((r + 1) * chunk, num_rows)) for r in range(world_size))


def box_numel(box: Box) -> int:
    return math.prod(max(0, stop - start) for start, stop in box)


def box_slices(box: Box) -> tuple[slice, ...]:
    """Index a tensor with a box: ``tensor[box_slices(box)]``."""
    return tuple(slice(start, stop) for start, stop in box)


def _shift(box: Box, origin: Sequence[int]) -> Box:
    return tuple((start - offset, stop - offset) for (start, stop), offset in zip(box, origin))


def plan_param(meta: ParamMeta, layout: GenerationLayout, rule: RuleFn, wire_itemsize: int) -> ParamPlan:
    """Plan one parameter: intersect every rank's destination region with every rank's FSDP rows."""
    if not meta.shape:
        raise ValueError(f"parameter {meta.name!r} is a scalar: FSDP2 shards dim 0, so it cannot be resharded")
    slices = resolve_split(meta.name, meta.shape, rule(meta.name, meta.shape), layout.tp_size)
    dst_regions = tuple(slices.boxes[layout.tp_rank(rank)] for rank in range(layout.world_size))
    src_rows = fsdp_row_ranges(meta.shape[0], layout.world_size)
    transfers = []
    for dst, region in enumerate(dst_regions):
        (row_start, row_stop), rest = region[0], region[1:]
        for src, (held_start, held_stop) in enumerate(src_rows):
            rows = (max(row_start, held_start), min(row_stop, held_stop))
            if rows[0] >= rows[1] or box_numel(rest) == 0:
                continue
            piece = (rows,) + rest
            transfers.append(Transfer(
                param=meta.name, src_rank=src, dst_rank=dst,
                src_box=_shift(piece, (held_start,) + (0,) * len(rest)),
                dst_box=_shift(piece, [start for start, _ in region]),
                region=piece, nbytes=box_numel(piece) * wire_itemsize))
    return ParamPlan(meta, slices, dst_regions, src_rows, tuple(transfers))


def build_plan(metas: Sequence[ParamMeta], layout: GenerationLayout, rule: RuleFn,
               wire_dtype: torch.dtype | None = None) -> ReshardPlan:
    """The resharding plan of a model (``metas`` in parameter order) into ``layout``.

    Args:
        metas: every parameter's HF name, full shape and master dtype.
        layout: ``N`` ranks and TP size ``t_g`` (``ValueError`` unless ``t_g`` divides ``N``).
        rule: ``rule(name, shape) -> SplitRule`` (``tp_rules.decoder_rules``); ``ValueError`` naming a parameter whose
            TP dim is not divisible by ``t_g``.
        wire_dtype: dtype sent and delivered (e.g. ``bfloat16`` for an fp32 master); default: the first param's dtype.
    """
    if not metas:
        raise ValueError("build_plan: no parameters")
    wire_dtype = wire_dtype or metas[0].dtype
    names = [meta.name for meta in metas]
    if len(set(names)) != len(names):
        raise ValueError("build_plan: duplicate parameter names")
    params = tuple(plan_param(meta, layout, rule, wire_dtype.itemsize) for meta in metas)
    return ReshardPlan(layout, wire_dtype, params)
