"""The resharding plan against reference slicing of the full tensors: every (N, t_g, layout order), uneven and empty
FSDP shards, GQA KV-head replication, padded vocab — and the errors for impossible splits."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from hybridrl.hybrid_engine.plan import (
    GenerationLayout, ParamMeta, box_slices, build_plan, fsdp_row_ranges,
)
from hybridrl.hybrid_engine.tp_rules import SplitRule, decoder_rules, resolve_split

from reshard_cases import (
    HEAD_DIM, decoder_metas, full_tensors, reference_fsdp_shard, reference_tp_slice,
)

GRID = [(n, t) for n in (1, 2, 4) for t in (1, 2, 4) if n % t == 0]
ORDERS = ("dp_major", "tp_major")


def simulate(plan, full):
    """Apply every transfer with plain indexing; return per-rank received slices and per-element write counts."""
    n = plan.world_size
    received, writes = {}, {}
    for param in plan.params:
        shards = [reference_fsdp_shard(full[param.meta.name], n, rank) for rank in range(n)]
        for rank in range(n):
            received[param.meta.name, rank] = torch.full(param.slice_shape(rank), float("nan"))
            writes[param.meta.name, rank] = torch.zeros(param.slice_shape(rank), dtype=torch.long)
        for transfer in param.transfers:
            piece = shards[transfer.src_rank][box_slices(transfer.src_box)]
            assert torch.equal(piece, full[param.meta.name][box_slices(transfer.region)])
            assert transfer.nbytes == piece.numel() * plan.wire_dtype.itemsize
            received[param.meta.name, transfer.dst_rank][box_slices(transfer.dst_box)] = piece
            writes[param.meta.name, transfer.dst_rank][box_slices(transfer.dst_box)] += 1
    return received, writes


def check_against_reference(metas, n, tp, order, kv_heads):
    layout = GenerationLayout(n, tp, order)
    plan = build_plan(metas, layout, decoder_rules(HEAD_DIM))
    full = full_tensors(metas)
    received, writes = simulate(plan, full)
    for meta in metas:
        for rank in range(n):
            expected = reference_tp_slice(meta.name, full[meta.name], tp, layout.tp_rank(rank), kv_heads)
            assert torch.equal(received[meta.name, rank], expected), (meta.name, rank)
            # zero redundancy: every element of a rank's slice arrives exactly once, nothing else arrives
            assert bool((writes[meta.name, rank] == 1).all()), (meta.name, rank)


@pytest.mark.parametrize("n,tp", GRID)
@pytest.mark.parametrize("order", ORDERS)
def test_plan_matches_reference_uneven(n, tp, order):
    # hidden 18 → FSDP chunks 5,5,5,3 on 4 ranks; vocab 37 → padded vocab slices 16,16,5,0 at t_g=4; 3-row tensor.
    metas = decoder_metas(hidden=18, heads=4, kv_heads=1, intermediate=24, vocab=37, qkv_bias=True, extra_small=True)
    check_against_reference(metas, n, tp, order, kv_heads=1)


@pytest.mark.parametrize("n,tp", GRID)
def test_plan_matches_reference_even_gqa(n, tp):
    metas = decoder_metas(hidden=16, heads=4, kv_heads=2, intermediate=32, vocab=128, layers=2)
    check_against_reference(metas, n, tp, "dp_major", kv_heads=2)


def test_plan_matches_reference_random_shapes():
    rng = random.Random(0)
    for _ in range(12):
        n, tp = rng.choice(GRID)
        kv_heads = rng.choice([h for h in (1, 2, 4, 8) if h % tp == 0 or tp % h == 0])
        heads = kv_heads * rng.choice([1, 2])
        heads = heads if heads % tp == 0 else tp
        metas = decoder_metas(hidden=rng.randint(1, 23), heads=heads, kv_heads=kv_heads,
                              intermediate=tp * rng.randint(1, 7), vocab=rng.randint(1, 150),
                              qkv_bias=rng.random() < 0.5, extra_small=True)
        check_against_reference(metas, n, tp, rng.choice(ORDERS), kv_heads)


def test_fsdp_rows_follow_torch_chunk():
    for rows, n in itertools.product(range(0, 13), (1, 2, 3, 4, 8)):
        chunks = torch.chunk(torch.arange(rows), n) if rows else ()
        expected = [len(chunk) for chunk in chunks] + [0] * (n - len(chunks))
        assert [stop - start for start, stop in fsdp_row_ranges(rows, n)] == expected
        assert fsdp_row_ranges(rows, n)[-1][1] == rows


def test_layout_orders():
    dp_major, tp_major = GenerationLayout(8, 2, "dp_major"), GenerationLayout(8, 2, "tp_major")
    assert dp_major.tp_group(1) == [2, 3]  # build_device_meshes' row-major [dp, tp]
    assert tp_major.tp_group(1) == [1, 5]
    assert sorted(r for d in range(4) for r in tp_major.tp_group(d)) == list(range(8))


def test_single_rank_is_all_local():
    plan = build_plan(decoder_metas(16, 4, 2, 32, 64), GenerationLayout(1, 1), decoder_rules(HEAD_DIM))
    assert all(transfer.is_local for transfer in plan.transfers)


def test_wire_dtype_sets_bytes():
    metas = decoder_metas(16, 4, 2, 32, 64)
    fp32 = build_plan(metas, GenerationLayout(2, 2), decoder_rules(HEAD_DIM))
    bf16 = build_plan(metas, GenerationLayout(2, 2), decoder_rules(HEAD_DIM), torch.bfloat16)
    assert fp32.total_bytes() == 2 * bf16.total_bytes()
    assert [t.nbytes for t in fp32.transfers] == [2 * t.nbytes for t in bf16.transfers]


# ------------------------------------------------------------------------------------------------------------- errors
def test_tp_size_must_divide_world_size():
    with pytest.raises(ValueError, match="tp_size=3 .* divide .* 4"):
        GenerationLayout(4, 3)
    with pytest.raises(ValueError, match="layout order"):
        GenerationLayout(4, 2, "column_major")


def test_heads_not_divisible_names_the_parameter():
    metas = decoder_metas(hidden=16, heads=3, kv_heads=1, intermediate=32, vocab=64)
    with pytest.raises(ValueError, match=r"q_proj\.weight.*3 heads.*t_g=2"):
        build_plan(metas, GenerationLayout(2, 2), decoder_rules(HEAD_DIM))


def test_kv_heads_neither_divisible_nor_replicable():
    metas = decoder_metas(hidden=16, heads=12, kv_heads=3, intermediate=32, vocab=64)
    with pytest.raises(ValueError, match=r"k_proj\.weight.*3 heads.*t_g=4.*replication"):
        build_plan(metas, GenerationLayout(4, 4), decoder_rules(HEAD_DIM))


def test_mlp_dim_not_divisible_names_the_parameter():
    metas = decoder_metas(hidden=16, heads=4, kv_heads=4, intermediate=30, vocab=64)
    with pytest.raises(ValueError, match=r"gate_proj\.weight.*30 rows.*t_g=4"):
        build_plan(metas, GenerationLayout(4, 4), decoder_rules(HEAD_DIM))


def test_vocab_without_padding_must_divide():
    with pytest.raises(ValueError, match=r"lm_head\.weight.*37 rows.*t_g=2"):
        resolve_split("lm_head.weight", (37, 8), decoder_rules(HEAD_DIM, vocab_pad_multiple=1)("lm_head.weight",
                                                                                                 (37, 8)), 2)
    with pytest.raises(ValueError, match=r"lm_head\.weight.*padded to 30"):
        resolve_split("lm_head.weight", (30, 8), SplitRule(dim=0, pad_multiple=10), 4)


def test_unknown_parameter_and_scalar():
    with pytest.raises(ValueError, match=r"no tensor-parallel rule for parameter 'model\.layers\.0\.router\.weight'"):
        build_plan([ParamMeta("model.layers.0.router.weight", (4, 4), torch.float32)], GenerationLayout(2, 2),
                   decoder_rules(HEAD_DIM))
    with pytest.raises(ValueError, match="'model.scale_norm.weight' is a scalar"):
        build_plan([ParamMeta("model.scale_norm.weight", (), torch.float32)], GenerationLayout(2, 1),
                   decoder_rules(HEAD_DIM))
