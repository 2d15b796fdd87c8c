"""The options end to end through the real workers (local mode, one CPU rank, tiny model): ``auto`` micro-batches
for actor and critic resolved at start-up, and the actor's update reporting its adaptive accumulation steps."""

from __future__ import annotations

import math

import pytest
import torch
from distributed_helpers import ray_config
from test_actor_worker import prompt_batch
from transformers import AutoConfig

from hybridrl.config import load_config
from hybridrl.runtime import PoolSpec, ResourcePool, WorkerGroup, start_ray
from hybridrl.protocol import Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.autotune.auto_micro_batch import sizing_options
from hybridrl.workers.critic_worker import CriticWorker
from hybridrl.autotune.memory_sizing import DecoderShape, estimate_micro_batch_bytes

pytestmark = pytest.mark.distributed

PROMPT_LENGTH, RESPONSE_LENGTH = 1018, 6  # sized for 1024-token sequences; the prompts themselves are short


def config_for(model_dir, budget_mb: int):
    # 4 prompts × n=2 on one rank: 8 sequences per optimizer step for actor and critic
    return load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.device=cpu",
                        "trainer.n_gpus_per_node=1", "algorithm=gae", "data.train_batch_size=4", "rollout.n=2",
                        f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}",
                        "actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=auto", "critic.ppo_micro_batch_size_per_gpu=auto",
                        f"actor.micro_batch_sizing.memory_budget_mb={budget_mb}",
                        f"critic.micro_batch_sizing.memory_budget_mb={budget_mb}",
                        "actor.adaptive_accumulation.enable=true", "actor.adaptive_accumulation.min_steps=2",
                        "actor.adaptive_accumulation.max_steps=8"])


def budget_for_two(model_dir) -> int:
    """A whole-MiB budget whose usable 85 % holds 2 sequences of 1024 tokens but not 4."""
    config = config_for(model_dir, 1)
    shape = DecoderShape.from_hf_config(AutoConfig.from_pretrained(model_dir))
    options = sizing_options(config, "actor", world_size=1)
    fits, too_big = (estimate_micro_batch_bytes(shape, size, PROMPT_LENGTH + RESPONSE_LENGTH, **options).total
                     for size in (2, 4))
    budget = math.ceil((fits + too_big) / 2 / 0.85 / 2**20)
    assert fits <= 0.85 * budget * 2**20 < too_big
    return budget


def test_workers_resolve_auto_and_update_with_adaptive_steps(tmp_path):
    # positions for the 1024-token sequences the sizing plans for (the config is refused otherwise)
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(max_position_embeddings=PROMPT_LENGTH + RESPONSE_LENGTH))
    config = config_for(model_dir, budget_for_two(model_dir))
    runtime = start_ray(ray_config(local_mode=True))
    actor_pool = ResourcePool.create(PoolSpec("actor_local", devices_per_node=1, device="cpu"), runtime)
    critic_pool = ResourcePool.create(PoolSpec("critic_local", devices_per_node=1, device="cpu"), runtime)
    with WorkerGroup(ActorRolloutRefWorker, actor_pool, name="actor_rollout_ref", args=(config, 2, False)) as actor, \
            WorkerGroup(CriticWorker, critic_pool, name="critic", args=(config, 2)) as critic:
        for group, method in ((actor, ActorRolloutRefWorker.batch_plan), (critic, CriticWorker.batch_plan)):
            plan, line = group.call(method)
            assert (plan.micro_batch_size_per_gpu, plan.grad_accum_steps) == (2, 4), line
            assert "=auto: budget" in line and "micro_batch_size=2, grad_accum_steps=4" in line
        rollout = actor.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir),
                             SamplingParams(n=2, max_new_tokens=RESPONSE_LENGTH, temperature=1.0, seed=5))
        rollout = rollout.union(actor.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
            Fields.OLD_LOG_PROBS))
        rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand(
            len(rollout), RESPONSE_LENGTH).contiguous()
        metrics = actor.call(ActorRolloutRefWorker.update_actor, rollout, step=0, temperature=1.0)[0]
    assert metrics["accumulation/grad_accum_steps"] == 4 and metrics["accumulation/effective_batch_sequences"] == 8
    assert metrics["accumulation/lr_multiplier"] == 1.0 and metrics["skipped_step"] == 0
    # measured from the 4 micro-batches, as the rule needs (B_simple is inf while the |G|² estimate is not positive)
    assert math.isfinite(metrics["grad_noise/trace"]) and metrics["grad_noise/b_simple"] > 0
