"""Per-rank bytes of a resharding: the plan's sum equals the exact interval identity (any shapes) and the closed-form
formula (even shapes), which reduces to M·(N−1)/N for t_g = 1 and to HybridFlow's M·(N − t_g)/(N·t_g)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.hybrid_engine.plan import GenerationLayout, ParamMeta, build_plan
from hybridrl.hybrid_engine.tp_rules import SplitRule, decoder_rules
from hybridrl.hybrid_engine.volume import (
    RankTraffic, closed_form_traffic, interval_traffic, plan_traffic,
)

from reshard_cases import HEAD_DIM, decoder_metas


def paper_received_bytes(total_bytes: int, world_size: int, tp_size: int) -> float:
    """HybridFlow's per-rank volume ``M·(N − t_g)/(N·t_g)`` (t_g = 1: ``M·(N−1)/N``) for all-dim-0, ``tp_major``."""
    return total_bytes * (world_size - tp_size) / (world_size * tp_size)

GRID = [(n, t) for n in (1, 2, 4, 8) for t in (1, 2, 4, 8) if n % t == 0]
ORDERS = ("dp_major", "tp_major")


def traffic_three_ways(metas, n, tp, order, dtype=torch.bfloat16):
    layout, rule = GenerationLayout(n, tp, order), decoder_rules(HEAD_DIM)
    plan = build_plan(metas, layout, rule, dtype)
    return plan, plan_traffic(plan), interval_traffic(metas, layout, rule, dtype)


@pytest.mark.parametrize("n,tp", GRID)
@pytest.mark.parametrize("order", ORDERS)
def test_plan_equals_closed_form_on_even_shapes(n, tp, order):
    metas = decoder_metas(hidden=64, heads=8, kv_heads=2, intermediate=128, vocab=256, layers=2, qkv_bias=True)
    plan, from_plan, exact = traffic_three_ways(metas, n, tp, order)
    assert from_plan == exact == closed_form_traffic(metas, plan.layout, decoder_rules(HEAD_DIM), plan.wire_dtype)
    assert sum(t.sent for t in from_plan) == sum(t.received for t in from_plan)


@pytest.mark.parametrize("n,tp", GRID)
@pytest.mark.parametrize("order", ORDERS)
def test_plan_equals_interval_identity_on_uneven_shapes(n, tp, order):
    metas = decoder_metas(hidden=18, heads=8, kv_heads=1, intermediate=24, vocab=37, qkv_bias=True, extra_small=True)
    _, from_plan, exact = traffic_three_ways(metas, n, tp, order)
    assert from_plan == exact
    if n == 1:
        return  # one rank: everything divides
    with pytest.raises(ValueError, match="does not divide evenly"):
        closed_form_traffic(metas, GenerationLayout(n, tp, order), decoder_rules(HEAD_DIM), torch.bfloat16)


@pytest.mark.parametrize("n", (1, 2, 4, 8))
def test_t_g_1_is_the_model_minus_own_shard(n):
    metas = decoder_metas(hidden=64, heads=8, kv_heads=2, intermediate=128, vocab=256, layers=2)
    plan, from_plan, _ = traffic_three_ways(metas, n, 1, "dp_major")
    m = plan.total_bytes()
    assert all(t == RankTraffic(sent=m * (n - 1) // n, received=m * (n - 1) // n, local=m // n) for t in from_plan)


@pytest.mark.parametrize("n,tp", [(2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (8, 8)])
def test_paper_formula_for_column_parallel_tp_major(n, tp):
    """All tensors split on dim 0 + HybridFlow grouping: each rank receives M/t_g − M/N (Table 2's HybridFlow row)."""
    metas = [ParamMeta(f"w{i}", (64 * (i + 1), 24), torch.float32) for i in range(5)]
    layout = GenerationLayout(n, tp, "tp_major")
    plan = build_plan(metas, layout, lambda name, shape: SplitRule(dim=0))
    m = plan.total_bytes()
    assert [t.received for t in plan_traffic(plan)] == [paper_received_bytes(m, n, tp)] * n
    assert [t.received for t in plan_traffic(plan)] == [m // tp - m // n] * n


def test_dp_major_moves_more_than_tp_major():
    """The row-major [dp, tp] mesh misaligns FSDP chunks and TP slices on some ranks (ranks 1, 2 of N=4, t_g=2)."""
    metas = [ParamMeta("w", (64, 8), torch.float32)]
    rule = lambda name, shape: SplitRule(dim=0)  # noqa: E731
    dp_major = plan_traffic(build_plan(metas, GenerationLayout(4, 2, "dp_major"), rule))
    tp_major = plan_traffic(build_plan(metas, GenerationLayout(4, 2, "tp_major"), rule))
    m = 64 * 8 * 4
    assert [t.received for t in tp_major] == [m // 4] * 4
    assert [t.received for t in dp_major] == [m // 4, m // 2, m // 2, m // 4]
