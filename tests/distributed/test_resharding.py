"""Resharding FSDP2 weights into the rollout layout on 4 real gloo processes (one spawn for everything).

A tiny Llama (vocab 128: every split even, so the closed-form formula applies) and a tiny Qwen2 (qkv biases, one KV
head, vocab 80: padded vocab slices are uneven and empty at t_g = 4) are sharded with FSDP2 over 4 ranks and streamed
for t_g ∈ {1, 2, 4} (and the all-gather path at t_g = 1). On every rank: each received slice equals the reference
slice of the full model loaded with ``from_pretrained`` (cast to bf16); bytes sent/received equal the plan and the
formula (the shared-memory method's reads included); the executor's largest live buffer stays under the bucket
bound. A synthetic module with 3-row and 5-row tensors checks empty FSDP shards and buckets in which some ranks
have nothing to send or receive.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hybridrl.hybrid_engine import (
    SplitRule, SyncChecksums, WeightResharder, WeightSyncMismatch, closed_form_traffic, interval_traffic, plan_traffic,
    stream_plan,
)
from hybridrl.hybrid_engine.plan import box_slices
from hybridrl.hybrid_engine.shared_memory import SHM_DIR, stream_shared
from hybridrl.hybrid_engine.sync import local_shards, param_metas
from hybridrl.utils.tiny_model import DEFAULT_CHARACTERS, TinyModelSpec, save_tiny_model
from hybridrl.modeling.fsdp import ShardingOptions, shard_model
from gloo_spawn import run_on_gloo

pytestmark = pytest.mark.distributed

WORLD = 4
BUCKET_BYTES = 48 << 10  # below the size of one bf16 MLP matrix at t_g = 1: exercises oversized single-param buckets
EXTRA_CHARACTERS = "".join(chr(code) for code in range(0xC0, 0xC0 + 48))  # 4 special + 76 + 48 = vocab 128


def reference_slice(name: str, full: torch.Tensor, tp_size: int, tp_rank: int, kv_heads: int,
                    head_dim: int) -> torch.Tensor:
    """The slice vLLM's loaders narrow out of the full HF tensor (vocab padded to 64), written out plainly."""
    module = name.split(".")[-2]
    if module.endswith("norm") or tp_size == 1:
        return full
    if module in ("embed_tokens", "lm_head"):
        per_rank = -(-full.shape[0] // 64) * 64 // tp_size
        start = min(tp_rank * per_rank, full.shape[0])
        return full[start:start + per_rank]
    if module in ("k_proj", "v_proj") and kv_heads < tp_size:
        return full.narrow(0, tp_rank // (tp_size // kv_heads) * head_dim, head_dim)
    if module in ("o_proj", "down_proj"):
        return full.narrow(1, tp_rank * full.shape[1] // tp_size, full.shape[1] // tp_size)
    return full.narrow(0, tp_rank * full.shape[0] // tp_size, full.shape[0] // tp_size)


def check_model(rank: int, model_dir: str, kv_heads: int, even: bool) -> list[dict]:
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    model = shard_model(AutoModelForCausalLM.from_pretrained(model_dir), init_device_mesh("cpu", (WORLD,)),
                        ShardingOptions())
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    records = []
    for tp_size, method in ((1, "gather"), (1, "plan"), (2, "plan"), (4, "plan"), (1, "shared"), (2, "shared"),
                            (4, "shared")):
        resharder = WeightResharder(model, tp_size=tp_size, bucket_bytes=BUCKET_BYTES, dtype=torch.bfloat16,
                                    method=method)
        received = {name: tensor.clone() for name, tensor in resharder.stream(checked=True)}
        resharder.verify()  # the fingerprints of what was sent and what arrived agree
        tp_rank = resharder.plan.layout.tp_rank(rank)
        for name, full in reference.items():
            if name in received:
                expected = reference_slice(name, full, tp_size, tp_rank, kv_heads, head_dim).to(torch.bfloat16)
                assert torch.equal(received[name], expected), (model_dir, tp_size, name)
        assert list(received) == [name for name, _ in model.named_parameters()]
        stats, plan = resharder.last_stats, resharder.plan
        metas, layout, rule = param_metas(model), plan.layout, _rule(model)
        if method in ("plan", "shared"):  # shared: what a rank reads of other ranks' writes is what it would receive
            planned = plan_traffic(plan)[rank]
            assert (stats.sent_bytes, stats.received_bytes, stats.local_bytes) == (
                planned.sent, planned.received, planned.local)
            assert planned == interval_traffic(metas, layout, rule, torch.bfloat16)[rank]
            if even:
                assert planned == closed_form_traffic(metas, layout, rule, torch.bfloat16)[rank]
        elif even:  # all-gather of even shards: each rank receives the model minus its own shard
            assert stats.received_bytes == plan.total_bytes() * (WORLD - 1) // WORLD
        assert 0 < stats.peak_buffer_bytes <= resharder.buffer_bound_bytes
        records.append(dict(model=model_dir.rsplit("/", 1)[-1], tp_size=tp_size, method=method, rank=rank,
                            sent=stats.sent_bytes, received=stats.received_bytes, local=stats.local_bytes,
                            model_bytes=plan.total_bytes(), peak_buffer=stats.peak_buffer_bytes,
                            bound=resharder.buffer_bound_bytes, buckets=stats.num_buckets))
        resharder.close()
    return records


def _rule(model):
    from hybridrl.hybrid_engine import rules_for_config
    return rules_for_config(model.config)


SYNTHETIC_SHAPES = {"tiny": (3, 5), "vocab": (33, 6), "col": (8, 3), "row": (5, 8)}
SYNTHETIC_RULES = {"tiny": SplitRule(), "vocab": SplitRule(dim=0, pad_multiple=16), "col": SplitRule(dim=0),
                   "row": SplitRule(dim=1)}


def _synthetic_module():
    """The synthetic FSDP2 module over the 4 ranks, its full tensors, and its split rule."""
    generator = torch.Generator().manual_seed(0)
    full = {name: torch.randn(shape, generator=generator) for name, shape in SYNTHETIC_SHAPES.items()}
    module = nn.Module()
    for name, tensor in full.items():
        module.register_parameter(name, nn.Parameter(tensor.clone()))
    fully_shard(module, mesh=init_device_mesh("cpu", (WORLD,)))
    module.config = None
    return module, full, lambda name, shape: SYNTHETIC_RULES[name]


def check_synthetic(rank: int) -> None:
    """Empty FSDP shards (3 rows on 4 ranks), padded uneven and empty slices (33 rows → 12, 12, 9, 0 at t_g = 4),
    one parameter per bucket, fp32 on the wire. Buckets where some ranks receive nothing while others do, and where
    nobody communicates at all (``col`` at t_g = 4: every slice is the rank's own shard), must not deadlock."""
    module, full, rule = _synthetic_module()
    partial_buckets = silent_buckets = 0
    for tp_size in (1, 2, 4):
        for order in ("dp_major", "tp_major"):
            resharder = WeightResharder(module, tp_size=tp_size, bucket_bytes=1, order=order, rule=rule,
                                        method="plan")
            for name, tensor in resharder.stream():
                region = resharder.plan.params[list(full).index(name)].dst_regions[rank]
                assert torch.equal(tensor, full[name][tuple(slice(a, b) for a, b in region)]), (name, tp_size)
            traffic = plan_traffic(resharder.plan)
            assert resharder.last_stats.received_bytes == traffic[rank].received
            for param in resharder.plan.params:  # bucket_bytes=1: one parameter per bucket
                receivers = {t.dst_rank for t in param.transfers if not t.is_local}
                partial_buckets += 0 < len(receivers) < WORLD
                silent_buckets += not receivers
    assert partial_buckets > 0 and silent_buckets > 0


def mismatch_after(module: nn.Module, resharder: WeightResharder, rank: int, tamper) -> str:
    """Run the checked sync with ``tamper`` applied to what arrives on this rank, between the transport and the
    receiver's fingerprints (as a corrupting wire would); the check's message on this rank, or "" if it passed."""
    checks = SyncChecksums(list(resharder.regions), WORLD)
    shards = local_shards(module, WORLD)
    if resharder.method == "shared":  # this rank's region of each full tensor in the arena
        arrived = ((name, full[box_slices(resharder.regions[name])]) for name, full in stream_shared(
            resharder.plan, resharder.buckets, shards, rank, resharder.arena, resharder.offsets, checksums=checks))
    else:
        arrived = stream_plan(resharder.plan, resharder.buckets, shards, rank, checksums=checks)
    for _ in checks.observe(tamper(arrived), resharder.regions):
        pass
    try:
        checks.verify(rank)
    except WeightSyncMismatch as error:
        return str(error)
    return ""


def flip_one_bit(name: str, on_rank: int, rank: int):
    def tamper(stream):
        for item_name, tensor in stream:
            if item_name == name and rank == on_rank:
                tensor = tensor.clone()
                tensor.view(-1)[0] = torch.nextafter(tensor.view(-1)[0], torch.tensor(float("inf")))
            yield item_name, tensor
    return tamper


def swap_two_rows(name: str, on_rank: int, rank: int):
    def tamper(stream):
        for item_name, tensor in stream:
            if item_name == name and rank == on_rank:
                tensor = tensor.clone()
                tensor[[0, 1]] = tensor[[1, 0]]
            yield item_name, tensor
    return tamper


def drop(name: str, on_rank: int, rank: int):
    def tamper(stream):
        return ((item_name, tensor) for item_name, tensor in stream if not (item_name == name and rank == on_rank))
    return tamper


def check_tampering_is_caught(rank: int, method: str) -> None:
    """One changed ulp, two swapped rows (same bytes, other places), a parameter that never arrived: each is named
    on the rank it happened to, and only there; an untouched sync passes on every rank."""
    module, _, rule = _synthetic_module()
    resharder = WeightResharder(module, tp_size=2, bucket_bytes=64, rule=rule, method=method)
    assert mismatch_after(module, resharder, rank, lambda stream: stream) == ""
    message = mismatch_after(module, resharder, rank, flip_one_bit("row", 1, rank))
    assert ("arrived different from what was sent: row" in message) == (rank == 1), (rank, message)
    message = mismatch_after(module, resharder, rank, swap_two_rows("col", 0, rank))
    assert ("arrived different from what was sent: col" in message) == (rank == 0), (rank, message)
    message = mismatch_after(module, resharder, rank, drop("vocab", 2, rank))
    assert ("1 never arrived: vocab" in message) == (rank == 2), (rank, message)
    assert message == "" or "rollout.verify_weight_sync" in message


def check_shared_views_outlive_their_bucket(rank: int) -> None:
    """vLLM's CPU reload keeps a layer's pieces until the layer is complete, so a shared-memory view must stay
    intact until the sync ends, whatever the buckets: hold every view of a one-parameter-per-bucket stream (each
    rank at its own pace) and compare them all at the end; the arena's file is gone from the directory at once."""
    module, full, rule = _synthetic_module()
    resharder = WeightResharder(module, tp_size=2, bucket_bytes=1, rule=rule, method="shared")
    assert resharder.arena.path.startswith(SHM_DIR) and not os.path.exists(resharder.arena.path)
    for version in range(2):  # new weights: the second sync must not write them under the first one's views
        if version:
            with torch.no_grad():
                for param in module.parameters():
                    param.to_local().add_(1.0)
        held = list(resharder.stream())
        assert len(resharder.buckets) == len(held)
        if rank == 0:
            time.sleep(0.2)  # the others race ahead to the next sync
        for name, tensor in held:
            region = resharder.plan.params[list(full).index(name)].dst_regions[rank]
            assert torch.equal(tensor, (full[name] + version)[box_slices(region)]), (name, version)
    resharder.close()


def worker(rank: int, world_size: int, llama_dir: str, qwen_dir: str, out_dir: str) -> None:
    records = check_model(rank, llama_dir, kv_heads=2, even=True)
    records += check_model(rank, qwen_dir, kv_heads=1, even=False)
    check_synthetic(rank)
    for method in ("plan", "shared"):
        check_tampering_is_caught(rank, method)
    check_shared_views_outlive_their_bucket(rank)
    with open(f"{out_dir}/rank{rank}.json", "w") as handle:
        json.dump(records, handle)


def test_resharding_fsdp2_to_rollout_layouts(tmp_path):
    llama = save_tiny_model(tmp_path / "llama", TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4,
                                                               num_kv_heads=2, intermediate_size=256),
                            characters=DEFAULT_CHARACTERS + EXTRA_CHARACTERS)
    qwen = save_tiny_model(tmp_path / "qwen2", TinyModelSpec(architecture="qwen2", hidden_size=128, num_layers=2,
                                                              num_heads=4, num_kv_heads=1, intermediate_size=256))
    run_on_gloo(WORLD, worker, str(llama), str(qwen), str(tmp_path))
    records = [r for rank in range(WORLD) for r in json.loads((tmp_path / f"rank{rank}.json").read_text())]
    for key in {(r["model"], r["tp_size"], r["method"]) for r in records}:
        group = [r for r in records if (r["model"], r["tp_size"], r["method"]) == key]
        assert sum(r["sent"] for r in group) == sum(r["received"] for r in group), key
    for r in sorted(records, key=lambda r: (r["model"], r["tp_size"], r["method"], r["rank"])):
        print(r)
