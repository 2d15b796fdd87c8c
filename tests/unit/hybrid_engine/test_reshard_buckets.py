"""Bucket packing bounds every rank's executor memory; the single-rank executor path, names and fused layouts."""

from __future__ import annotations

import pytest
import torch

from hybridrl.hybrid_engine.buckets import (
    bucket_bound, bucket_bytes_from_mb, gather_footprint, p2p_footprint, pack_buckets,
)
from hybridrl.hybrid_engine.names import EngineName, engine_name_map, fused_name, fused_row_offsets, rename
from hybridrl.hybrid_engine.plan import GenerationLayout, build_plan
from hybridrl.hybrid_engine.tp_rules import decoder_rules
from hybridrl.hybrid_engine.transfer import TransferStats, stream_gathered, stream_plan

from reshard_cases import HEAD_DIM, decoder_metas, full_tensors, reference_tp_slice

METAS = decoder_metas(hidden=18, heads=4, kv_heads=1, intermediate=24, vocab=37, layers=3, extra_small=True)


@pytest.mark.parametrize("n,tp", [(1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (4, 4)])
@pytest.mark.parametrize("bucket_bytes", [1, 200, 1000, 5000, 10**9])
def test_buckets_respect_the_bound(n, tp, bucket_bytes):
    plan = build_plan(METAS, GenerationLayout(n, tp), decoder_rules(HEAD_DIM), torch.bfloat16)
    for footprint in (p2p_footprint(plan), gather_footprint(plan)):
        buckets = pack_buckets(plan, bucket_bytes, footprint)
        assert [i for bucket in buckets for i in bucket.param_indices] == list(range(len(plan.params)))
        for bucket in buckets:
            assert bucket.peak_bytes <= bucket_bytes or len(bucket.param_indices) == 1
            assert bucket.bytes_per_rank == tuple(map(sum, zip(*(footprint(plan.params[i])
                                                                  for i in bucket.param_indices))))
        assert max(b.peak_bytes for b in buckets) <= bucket_bound(buckets, bucket_bytes)
        if bucket_bytes >= 10**9:
            assert len(buckets) == 1


def test_footprint_counts_slice_and_staging_not_already_in_the_output():
    plan = build_plan(METAS, GenerationLayout(2, 1), decoder_rules(HEAD_DIM), torch.float32)
    lm_head = plan.params[-1]  # [37, 18]: each rank needs all of it and sends its own rows from its output
    assert p2p_footprint(plan)(lm_head) == (37 * 18 * 4,) * 2
    assert gather_footprint(plan)(lm_head) == (38 * 18 * 4,) * 2  # padded to 2 chunks of 19 rows
    plan = build_plan(METAS, GenerationLayout(2, 2), decoder_rules(HEAD_DIM), torch.float32)
    o_proj = next(p for p in plan.params if p.meta.name.endswith("o_proj.weight"))  # [18, 16], split on dim 1
    # output: all 18 rows x 8 columns; staging: own 9 rows x the peer's 8 columns
    assert p2p_footprint(plan)(o_proj) == ((18 * 8 + 9 * 8) * 4,) * 2


def test_bucket_bytes_validation_and_units():
    plan = build_plan(METAS, GenerationLayout(1, 1), decoder_rules(HEAD_DIM))
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        pack_buckets(plan, 0, p2p_footprint(plan))
    assert bucket_bytes_from_mb(256) == 256 << 20


@pytest.mark.parametrize("stream", [stream_plan, stream_gathered])
def test_single_rank_stream_casts_and_bounds_memory(stream):
    """N = 1 needs no process group: the whole path runs, cast to bf16, bucket by bucket."""
    plan = build_plan(METAS, GenerationLayout(1, 1), decoder_rules(HEAD_DIM), torch.bfloat16)
    full = full_tensors(METAS)
    footprint = p2p_footprint(plan) if stream is stream_plan else gather_footprint(plan)
    buckets = pack_buckets(plan, 1500, footprint)
    stats = TransferStats()
    names = []
    for name, tensor in stream(plan, buckets, full, 0, stats=stats):
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, full[name].to(torch.bfloat16))
        names.append(name)
    assert names == [meta.name for meta in METAS]
    assert stats.num_buckets == len(buckets) > 1 and stats.sent_bytes == stats.received_bytes == 0
    assert stats.local_bytes == plan.total_bytes()
    assert 0 < stats.peak_buffer_bytes <= bucket_bound(buckets, 1500)


def test_local_shard_shape_is_checked():
    plan = build_plan(METAS, GenerationLayout(1, 1), decoder_rules(HEAD_DIM))
    shards = full_tensors(METAS)
    shards["lm_head.weight"] = shards["lm_head.weight"][:5]
    with pytest.raises(ValueError, match=r"'lm_head.weight' on rank 0 has shape \(5, 18\)"):
        next(stream_plan(plan, pack_buckets(plan, 10**9, p2p_footprint(plan)), shards, 0))
    with pytest.raises(ValueError, match="needs|t_g=2"):
        two = build_plan(METAS, GenerationLayout(2, 2), decoder_rules(HEAD_DIM))
        next(stream_gathered(two, [], shards, 0))


# ------------------------------------------------------------------------------------------------------------ names
def test_name_maps():
    assert engine_name_map("hf")("model.layers.0.self_attn.q_proj.weight") == EngineName(
        "model.layers.0.self_attn.q_proj.weight")
    assert fused_name("model.layers.3.self_attn.v_proj.bias") == EngineName(
        "model.layers.3.self_attn.qkv_proj.bias", "v")
    assert fused_name("model.layers.3.mlp.up_proj.weight") == EngineName("model.layers.3.mlp.gate_up_proj.weight", 1)
    assert fused_name("model.norm.weight") == EngineName("model.norm.weight")
    assert [n.name for n, _ in rename([("lm_head.weight", torch.zeros(1))], engine_name_map("vllm_fused"))] == [
        "lm_head.weight"]
    with pytest.raises(ValueError, match="unknown engine name map 'sglang'"):
        engine_name_map("sglang")


@pytest.mark.parametrize("tp,kv_heads", [(1, 2), (2, 2), (4, 2), (4, 1), (2, 4)])
def test_fused_offsets_match_the_plan_slices(tp, kv_heads):
    """Stacking a TP rank's q, k, v (gate, up) slices at ``fused_row_offsets`` gives vLLM's fused local tensor."""
    metas = decoder_metas(hidden=16, heads=4, kv_heads=kv_heads, intermediate=32, vocab=64)
    full = full_tensors(metas)
    offsets = fused_row_offsets(4, kv_heads, HEAD_DIM, 32, tp)
    for tp_rank in range(tp):
        for fused, shards in offsets.items():
            expected_rows = 0
            for shard_id, (start, stop) in shards.items():
                hf = {"q": "q_proj", "k": "k_proj", "v": "v_proj", 0: "gate_proj", 1: "up_proj"}[shard_id]
                prefix = "model.layers.0." + ("self_attn." if fused == "qkv_proj" else "mlp.")
                piece = reference_tp_slice(prefix + hf + ".weight", full[prefix + hf + ".weight"], tp, tp_rank,
                                           kv_heads)
                assert piece.shape[0] == stop - start and start == expected_rows
                expected_rows = stop
