"""HF generation on an FSDP2-sharded actor gathers each layer once per ``generate`` (not once per decode step), runs
the fast decode step on the gathered weights, and produces exactly what the unsharded model produces; afterwards the
parameters are sharded again as configured."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_spawn import run_on_gloo
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from hybridrl.config.schema import ModelConfig
from hybridrl.protocol import Batch
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.fsdp import ShardingOptions, parameters_kept_gathered, shard_model
from hybridrl.modeling.model_builder import build_model

pytestmark = pytest.mark.distributed
NEW_TOKENS = 6


def prompts() -> Batch:
    ids = torch.randint(4, 60, (3, 5), generator=torch.Generator().manual_seed(0))
    return Batch(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def greedy(model, fast_decode: bool = True) -> tuple[Batch, str]:
    """Greedy responses, and what ran the decode steps (``HFRollout.decode_path``)."""
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=[1], fast_decode=fast_decode)
    return engine.generate(prompts(), SamplingParams(n=1, max_new_tokens=NEW_TOKENS, do_sample=False)), engine.decode_path


def generate_counting_all_gathers(rank, world, model_dir, out_path):
    calls = []
    original = dist.all_gather_single

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_gather_single = counted
    results = {}
    for reshard, fast in ((True, True), (False, True), (True, False)):
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(reshard_after_forward=reshard))
        groups = sum(1 for _ in filter(lambda m: hasattr(m, "reshard"), model.modules()))
        calls.clear()
        out, path = greedy(model, fast)
        gathers = len(calls)
        sharded = all(isinstance(p, DTensor) for p in model.parameters())   # freed again after generate
        with parameters_kept_gathered(model):   # the setting is restored on exit: another forward behaves as before
            pass
        calls.clear()
        model(input_ids=prompts()["input_ids"])
        model(input_ids=prompts()["input_ids"])
        results[reshard, fast] = dict(responses=out["responses"], log_probs=out["rollout_log_probs"],
                                      gathers=gathers, groups=groups, gathers_two_forwards=len(calls),
                                      sharded=sharded, path=path)
    dist.all_gather_single = original
    if rank == 0:
        torch.save(results, out_path)


def test_generation_gathers_once_per_group_and_matches_the_unsharded_model(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    run_on_gloo(2, generate_counting_all_gathers, model_dir, tmp_path / "out.pt")
    results = torch.load(tmp_path / "out.pt", weights_only=True)
    reference, _ = greedy(build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor"))
    for (reshard, fast), result in results.items():
        assert torch.equal(result["responses"], reference["responses"]), reshard
        assert torch.allclose(result["log_probs"], reference["rollout_log_probs"], atol=1e-5), reshard
        assert result["gathers"] == result["groups"], (reshard, result)   # once per FSDP group, not per token
        assert result["sharded"]
        assert result["path"] == ("fast" if fast else "module")   # the fast step runs on the gathered shards
    # reshard_after_forward restored: True re-gathers every group on each forward, False keeps them after the first
    assert results[True, True]["gathers_two_forwards"] == 2 * results[True, True]["groups"]
    assert results[False, True]["gathers_two_forwards"] == results[False, True]["groups"]


ENDINGS = list(range(1, 9))   # eight EOS ids: sampled rows end at spread-out steps


def sample_with_ending_rows(rank, world, model_dir, out_path):
    """Each rank samples its own prompts on the sharded model; rows that end leave the decode batch on one rank while
    the other rank's keep stepping (both ranks run until every row of both has ended)."""
    results = {}
    for fast in (True, False):
        model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
        shard_model(model, init_device_mesh("cpu", (world,)), ShardingOptions(reshard_after_forward=True))
        engine = HFRollout(model, pad_token_id=0, eos_token_ids=ENDINGS, fast_decode=fast)
        out = engine.generate(rank_prompts(rank), SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=5))
        results[fast] = dict(responses=out["responses"], log_probs=out["rollout_log_probs"],
                             rows_run=engine.decode_rows_run, path=engine.decode_path)
    torch.save(results, f"{out_path}.{rank}")


def rank_prompts(rank: int) -> Batch:
    ids = torch.randint(10, 60, (4, 5), generator=torch.Generator().manual_seed(10 + rank))
    return Batch(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def test_ranks_drop_their_own_ended_rows_and_sample_what_one_process_samples(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    run_on_gloo(2, sample_with_ending_rows, model_dir, tmp_path / "out.pt")
    model = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    dropped_somewhere = False
    for rank in range(2):
        results = torch.load(f"{tmp_path / 'out.pt'}.{rank}", weights_only=True)
        engine = HFRollout(model, pad_token_id=0, eos_token_ids=ENDINGS, drop_ended_rows=False)
        reference = engine.generate(rank_prompts(rank), SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=5))
        for fast, result in results.items():
            assert result["path"] == ("fast" if fast else "module")
            assert torch.equal(result["responses"], reference["responses"]), (rank, fast)
            torch.testing.assert_close(result["log_probs"], reference["rollout_log_probs"], atol=1e-5, rtol=0)
            dropped_somewhere |= result["rows_run"] < engine.decode_rows_run
    assert dropped_somewhere
