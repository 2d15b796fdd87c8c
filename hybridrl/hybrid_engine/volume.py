"""Communication volume of a resharding: per-rank bytes sent and received, three independent ways.

1. ``plan_traffic`` — sum the plan's transfers (what ``transfer.py`` will actually move).
2. ``interval_traffic`` — the exact identity, from intervals alone (any shapes, uneven shards included):
   ``received_r = Σ_p |S_r(p)| − |S_r(p) ∩ F_r(p)|`` and ``sent_r = Σ_p Σ_{d≠r} |S_d(p) ∩ F_r(p)|``, where ``S_r(p)``
   is rank r's generation slice of parameter p and ``F_r(p)`` its FSDP row shard (sizes in bytes of the wire dtype).
3. ``closed_form_traffic`` — the formula, valid when every dim divides evenly. With ``M_p`` bytes of parameter p,
   ``k_p`` distinct TP parts (``t_g``; ``H_kv`` under KV replication; 1 if replicated) and ``N`` ranks::

       replicated:       received = sent = M_p·(N−1)/N
       split on dim 0:   received = M_p/k_p − a_r·M_p/N            sent = M_p/N·(N/k_p − a_r)
       split on dim 1:   received = sent = M_p·(N−1)/(N·k_p)

   where ``a_r = 1`` when rank r's FSDP chunk lies inside its own TP slice (always under the HybridFlow ``tp_major``
   grouping; for ``dp_major`` exactly when ``⌊r·k_p/N⌋`` is r's part index). Summed over parameters:

   * ``t_g = 1``: every rank receives ``M·(N−1)/N`` — the full model minus its own shard (an all-gather);
   * ``t_g > 1`` with ``tp_major`` and only dim-0 splits: ``M·(N − t_g)/(N·t_g)`` = ``M/t_g`` minus the ``M/N`` it
     holds — HybridFlow's Table 2 entry with ``t·p = N`` (training shards) and ``t_g·p_g = t_g``;
   * row-parallel (dim-1) and replicated tensors cannot reuse more than ``M_p/(N·k_p)`` resp. ``M_p/N`` of a dim-0
     FSDP shard, which is what the formula charges them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hybridrl.hybrid_engine.plan import (
    GenerationLayout, ParamMeta, ReshardPlan, box_numel, fsdp_row_ranges,
)
from hybridrl.hybrid_engine.tp_rules import Box, RuleFn, resolve_split


@dataclass(frozen=True)
class RankTraffic:
    """Bytes one rank moves in a resharding: ``sent``/``received`` over the network, ``local`` copied in place."""

    sent: int = 0
    received: int = 0
    local: int = 0

    def __add__(self, other: "RankTraffic") -> "RankTraffic":
        return RankTraffic(self.sent + other.sent, self.received + other.received, self.local + other.local)


def plan_traffic(plan: ReshardPlan) -> list[RankTraffic]:
    """Per-rank traffic (index = rank) summed over the plan's transfers."""
    sent, received, local = ([0] * plan.world_size for _ in range(3))
    for transfer in plan.transfers:
        if transfer.is_local:
            local[transfer.src_rank] += transfer.nbytes
        else:
            sent[transfer.src_rank] += transfer.nbytes
            received[transfer.dst_rank] += transfer.nbytes
    return [RankTraffic(*values) for values in zip(sent, received, local)]


def _rows_overlap(region: Box, rows: tuple[int, int]) -> int:
    (start, stop), rest = region[0], region[1:]
    return max(0, min(stop, rows[1]) - max(start, rows[0])) * box_numel(rest)


def interval_traffic(metas: Sequence[ParamMeta], layout: GenerationLayout, rule: RuleFn,
                     wire_dtype: torch.dtype) -> list[RankTraffic]:
    """Exact per-rank traffic from region/shard overlaps alone (no transfer list), for any shapes."""
    n = layout.world_size
    totals = [RankTraffic() for _ in range(n)]
    for meta in metas:
        slices = resolve_split(meta.name, meta.shape, rule(meta.name, meta.shape), layout.tp_size)
        regions = [slices.boxes[layout.tp_rank(rank)] for rank in range(n)]
        shards = fsdp_row_ranges(meta.shape[0], n)
        for rank in range(n):
            own = _rows_overlap(regions[rank], shards[rank])
            sent = sum(_rows_overlap(regions[dst], shards[rank]) for dst in range(n) if dst != rank)
            step = RankTraffic(sent=sent, received=box_numel(regions[rank]) - own, local=own)
            totals[rank] = totals[rank] + RankTraffic(*(value * wire_dtype.itemsize for value in vars(step).values()))
    return totals


def closed_form_traffic(metas: Sequence[ParamMeta], layout: GenerationLayout, rule: RuleFn,
                        wire_dtype: torch.dtype) -> list[RankTraffic]:
    """Per-rank traffic from the formula in the module docstring; ``ValueError`` if a shape does not divide evenly."""
    n = layout.world_size
    totals = [[0.0, 0.0, 0.0] for _ in range(n)]
    for meta in metas:
        split = resolve_split(meta.name, meta.shape, rule(meta.name, meta.shape), layout.tp_size)
        if meta.shape[0] % n or len({box_numel(box) for box in split.boxes}) != 1:
            raise ValueError(f"closed_form_traffic: {meta.name!r} {meta.shape} does not divide evenly over N={n}, "
                             f"t_g={layout.tp_size}; use interval_traffic")
        m, k = meta.numel * wire_dtype.itemsize, split.num_parts
        for rank in range(n):
            step = _closed_form_one(split.rule.dim, m, k, n, rank, layout)
            totals[rank] = [total + extra for total, extra in zip(totals[rank], step)]
    return [RankTraffic(*(round(value) for value in row)) for row in totals]


def _closed_form_one(dim: int | None, m: float, k: int, n: int, rank: int,
                     layout: GenerationLayout) -> tuple[float, float, float]:
    """``(sent, received, local)`` bytes of one evenly divisible parameter of ``m`` bytes for ``rank``."""
    if dim is None or k == 1:
        return m * (n - 1) / n, m * (n - 1) / n, m / n
    if dim == 0:
        part = layout.tp_rank(rank) * k // layout.tp_size
        aligned = 1 if rank * k // n == part else 0
        return m / n * (n / k - aligned), m / k - aligned * m / n, aligned * m / n
    return m * (n - 1) / (n * k), m * (n - 1) / (n * k), m / (n * k)
