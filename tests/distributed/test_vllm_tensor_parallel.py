"""``rollout.tensor_model_parallel_size=2``: one vLLM replica over the actor's 2 Ray CPU ranks (vLLM's CPU build,
its external-launcher executor joining the ranks' gloo world), fed by the resharding plan — each rank receives only
its tensor-parallel slices — and checked against plain ``transformers`` and the trainer's log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from distributed_helpers import cpu_pool, stop
from stale_shm_worker import ActorWorkerAfterAKilledRun
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config import load_config
from hybridrl.hybrid_engine.tp_rules import resolve_split, rules_for_config
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerError, WorkerGroup
from hybridrl.utils.tiny_model import encode_chat, save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker

# test-long (CI runs it): its TP-2 engine group took 54-102 s of the parallel suite, whose 15 minutes it outgrew on
# a slower VM (2026-12-06); make test keeps the colocated TP-1 engine following updates (test_actor_worker.py).
pytestmark = [pytest.mark.distributed, pytest.mark.long]

PROMPTS = ["12+34=", "7*8=", "100-1=", "5+5="]
MAX_NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("vllm_tp") / "model")  # 2 heads, 1 KV head: KV replicated


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def tp_group(ray_runtime, model_dir):
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          "rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2", "data.train_batch_size=4",
                          "rollout.n=2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=2",
                          "actor.optim.lr=1e-2", f"data.max_response_length={MAX_NEW_TOKENS}"])
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "vllm_tp_pool", 2), name="actor_vllm_tp",
                        args=(config, 10, False), tp_size=2)
    yield group
    stop(group)


def prompt_batch(tokenizer) -> Batch:
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, PROMPTS)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{i}" for i in range(len(PROMPTS))]})


def transformers_greedy(model_dir, tokenizer) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = []
    for ids in encode_chat(tokenizer, PROMPTS):
        output = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id)[0, len(ids):]
        rows.append(torch.cat([output, output.new_full((MAX_NEW_TOKENS - len(output),), tokenizer.pad_token_id)]))
    return torch.stack(rows)


def rank0_slice_bytes(model_dir) -> int:
    """fp32 bytes of TP rank 0's regions of every parameter under vLLM's split (``tp_rules``), computed here."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rule = rules_for_config(model.config)
    total = 0
    for name, param in model.named_parameters():
        box = resolve_split(name, tuple(param.shape), rule(name, tuple(param.shape)), 2).boxes[0]
        total += math.prod(stop - start for start, stop in box) * 4
    return total


def full_model_bytes(model_dir) -> int:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return sum(param.numel() * 4 for param in model.parameters())


def log_prob_gap(group, rollout: Batch) -> float:
    trainer = group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)[Fields.OLD_LOG_PROBS]
    mask = rollout[Fields.RESPONSE_MASK].bool()
    return float((trainer - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max())


def test_tp2_greedy_tokens_equal_transformers(tp_group, model_dir, tokenizer):
    rollout = tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer),
                            SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
    assert len(rollout) == len(PROMPTS)  # one replica: its TP rank 0 answers, the peer's identical copy is dropped
    assert torch.equal(rollout[Fields.RESPONSES], transformers_greedy(model_dir, tokenizer))


def test_tp2_engine_follows_an_update_through_sliced_weights(tp_group, model_dir, tokenizer):
    """After an optimizer step, each rank receives only its TP slices (about half the model on 2 ranks) and the
    engine's log-probs of its own samples match the trainer's on the new weights (the per-step numerics gate)."""
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=7)
    rollout = tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer), params)
    assert log_prob_gap(tp_group, rollout) < 1e-4
    rollout = rollout.union(tp_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
        Fields.OLD_LOG_PROBS))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand(
        len(rollout), MAX_NEW_TOKENS).contiguous()
    tp_group.call(ActorRolloutRefWorker.update_actor, rollout, step=0, temperature=1.0)
    stats = tp_group.call(ActorRolloutRefWorker.sync_rollout_weights)
    assert stats["weight_sync/delivered_bytes"] == rank0_slice_bytes(model_dir)  # its slices, nothing more
    assert stats["weight_sync/delivered_bytes"] < 0.6 * full_model_bytes(model_dir)
    after = tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer), params)
    assert log_prob_gap(tp_group, after) < 1e-4
    # the policy did change, so the match after the sync is not vacuous: a stale engine would be off by this much
    assert log_prob_gap(tp_group, rollout) > 1e-3


def test_generation_after_an_update_without_a_sync_is_refused(tp_group, tokenizer):
    """The weights the engine holds are versioned: a skipped sync is an error naming both versions, not samples
    from the old policy trained on as if they were the new one's."""
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=11)
    rollout = tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer), params)
    rollout = rollout.union(tp_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
        Fields.OLD_LOG_PROBS))
    rollout[Fields.ADVANTAGES] = torch.ones(len(rollout), MAX_NEW_TOKENS)
    tp_group.call(ActorRolloutRefWorker.update_actor, rollout, step=1, temperature=1.0)
    with pytest.raises(WorkerError, match="a weight sync was skipped") as caught:
        tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer), params)
    assert "holds the weights of version" in str(caught.value)
    tp_group.call(ActorRolloutRefWorker.sync_rollout_weights)
    after = tp_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer), params)
    assert log_prob_gap(tp_group, after) < 1e-4


def test_tp2_engine_starts_over_segments_a_killed_run_left(ray_runtime, model_dir, tokenizer):
    """Each rank removes the segments named after its group's port before vLLM creates them (the port is held by
    the group's store while it lives, so only a dead run can have left them), then generates as usual."""
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          "rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2", "data.train_batch_size=4",
                          "actor.ppo_mini_batch_size=4", f"data.max_response_length={MAX_NEW_TOKENS}"])
    group = WorkerGroup(ActorWorkerAfterAKilledRun, cpu_pool(ray_runtime, "vllm_tp_stale_pool", 2),
                        name="actor_vllm_tp_stale", args=(config, 10, False), tp_size=2)
    try:
        rollout = group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(tokenizer),
                             SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False))
        assert torch.equal(rollout[Fields.RESPONSES], transformers_greedy(model_dir, tokenizer))
    finally:
        stop(group)
