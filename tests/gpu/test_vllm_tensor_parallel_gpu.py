"""A t_g = 2 vLLM replica on 2 GPUs, fed by the resharding plan over NCCL: the GPU twin of
``tests/distributed/test_vllm_tensor_parallel.py`` (which runs the same path on CPU with vLLM's CPU build and gloo).

Each of 2 NCCL ranks shards a tiny Llama with FSDP2, runs ``VLLMRollout`` with ``tensor_model_parallel_size=2``
(vLLM's external-launcher executor joins the ranks' process group), and checks: greedy tokens equal plain
``transformers``; after a perturbation of the trainer's weights and a checked sync of each rank's TP slices, the
engine's log-probs follow the new weights. Skipped without 2 CUDA devices or without vLLM.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from gloo_spawn import run_on_gloo  # noqa: E402

from hybridrl.utils.tiny_model import save_tiny_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")]
MAX_NEW_TOKENS = 8
LOG_PROB_TOLERANCE = 2e-3  # fp32 on different kernels (vLLM attention vs sdpa); a stale engine is off by ≫ 0.1


def tp_worker(rank: int, world_size: int, model_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridrl.config.schema import RolloutConfig
    from hybridrl.hybrid_engine import WeightResharder
    from hybridrl.modeling.fsdp import ShardingOptions, shard_model
    from hybridrl.modeling.sequences import response_log_probs
    from hybridrl.protocol import Batch, Fields
    from hybridrl.rollout.base import SamplingParams
    from hybridrl.rollout.vllm_engine import VLLMRollout
    from hybridrl.utils.tiny_model import encode_chat

    os.environ["LOCAL_RANK"] = str(rank)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    engine = VLLMRollout(model_dir, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
                         rollout=RolloutConfig(name="vllm", kv_cache_memory_mb=512, tensor_model_parallel_size=2,
                                               free_cache_engine=False),
                         max_model_len=128, dtype="float32", seed=0)
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, ["12+34=", "7*8="])}, return_tensors="pt")
    prompts = Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]})
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    for row, ids in enumerate(encoded["input_ids"]):
        mask = encoded["attention_mask"][row].bool()
        expected = reference.generate(ids[mask][None].cuda(), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        produced = expected[0, int(mask.sum()):].cpu()
        assert torch.equal(greedy[Fields.RESPONSES][row, :len(produced)], produced), row

    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    with torch.no_grad():
        generator = torch.Generator(device="cuda").manual_seed(0)  # the same perturbation on both ranks
        for parameter in trainer.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, device="cuda") * 0.05)
    perturbed = {name: parameter.detach().clone() for name, parameter in trainer.named_parameters()}
    shard_model(trainer, init_device_mesh("cuda", (world_size,)), ShardingOptions())
    resharder = WeightResharder(trainer, tp_size=2, bucket_bytes=1 << 20, dtype=torch.float32)
    engine.update_weights(resharder.stream_full_shaped(checked=True))
    resharder.verify()
    reference.load_state_dict(perturbed, strict=False)
    sampled = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0.7, seed=3))
    with torch.no_grad():
        log_probs, _ = response_log_probs(reference, sampled[Fields.INPUT_IDS].cuda(),
                                          sampled[Fields.ATTENTION_MASK].cuda(), MAX_NEW_TOKENS, temperature=0.7)
    mask = sampled[Fields.RESPONSE_MASK].bool().cuda()
    gap = float((log_probs - sampled[Fields.ROLLOUT_LOG_PROBS].cuda()).abs()[mask].max())
    assert gap < LOG_PROB_TOLERANCE, gap
    engine.close()


def test_tp2_replica_on_two_gpus_generates_and_follows_a_checked_sync(tmp_path):
    pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[vllm]')")
    model_dir = save_tiny_model(tmp_path / "model")
    run_on_gloo(2, tp_worker, str(model_dir), backend="nccl")
