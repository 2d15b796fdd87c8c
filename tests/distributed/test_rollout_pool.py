"""Split placement (``rollout.n_gpus > 0``): a standalone rollout pool of vLLM replicas (CPU build) beside a 1-rank
FSDP trainer, weights published through host shared memory and checked — greedy tokens equal ``transformers``,
rollout log-probs match the trainer's after an update, a skipped sync is refused, a damaged arena is named."""

from __future__ import annotations

import pytest
import torch
from distributed_helpers import cpu_pool
from test_vllm_tensor_parallel import (MAX_NEW_TOKENS, full_model_bytes, log_prob_gap, prompt_batch,
                                       rank0_slice_bytes, transformers_greedy)
from transformers import AutoTokenizer

from hybridrl.config import load_config
from hybridrl.protocol import Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerError, WorkerGroup
from hybridrl.trainers.generation import Generation
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("rollout_pool") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module", params=[1, 2], ids=["pool1", "pool2_tp2"])
def split(request, ray_runtime, model_dir):
    """1 trainer rank + a pool of ``M`` ranks forming one replica of ``t_g = M``."""
    pool_size = request.param
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=1",
                          "rollout=vllm_cpu", f"rollout.n_gpus={pool_size}",
                          f"rollout.tensor_model_parallel_size={pool_size}", "data.train_batch_size=4",
                          "rollout.n=2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=4",
                          "actor.optim.lr=1e-2", f"data.max_response_length={MAX_NEW_TOKENS}"])
    actor = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, f"split_actor{pool_size}", 1),
                        name=f"split_actor{pool_size}", args=(config, 10, False))
    pool = WorkerGroup(RolloutWorker, cpu_pool(ray_runtime, f"split_rollout{pool_size}", pool_size),
                       name=f"split_rollout{pool_size}", args=(config,), tp_size=pool_size)
    yield Generation(actor, "vllm", pool), actor, pool_size
    pool.shutdown()
    actor.shutdown()


def update(actor, rollout, step: int) -> None:
    rollout = rollout.union(actor.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
        Fields.OLD_LOG_PROBS))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand(
        len(rollout), MAX_NEW_TOKENS).contiguous()
    actor.call(ActorRolloutRefWorker.update_actor, rollout, step=step, temperature=1.0)


def test_pool_greedy_tokens_equal_transformers(split, model_dir, tokenizer):
    generation, _, _ = split
    rollout = generation.generate(prompt_batch(tokenizer), SamplingParams(max_new_tokens=MAX_NEW_TOKENS,
                                                                          do_sample=False))
    assert torch.equal(rollout[Fields.RESPONSES], transformers_greedy(model_dir, tokenizer))


def test_pool_follows_the_trainer_through_published_weights(split, model_dir, tokenizer):
    """After an optimizer step on the trainer, the published, checked weights reach the pool: its log-probs of its
    own samples match the trainer's again (and did not before the sync: the update was not vacuous). Each pool
    rank reads only its TP regions."""
    generation, actor, pool_size = split
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=7)
    rollout = generation.generate(prompt_batch(tokenizer), params)
    assert log_prob_gap(actor, rollout) < 1e-4
    update(actor, rollout, step=0)
    stats = generation.sync_weights()
    assert stats["weight_sync/delivered_bytes"] == (rank0_slice_bytes(model_dir) if pool_size == 2
                                                    else full_model_bytes(model_dir))
    after = generation.generate(prompt_batch(tokenizer), params)
    assert log_prob_gap(actor, after) < 1e-4
    assert log_prob_gap(actor, rollout) > 1e-3


def test_pool_refuses_to_generate_from_weights_it_was_not_given(split, tokenizer):
    """The controller names the version it expects; a pool whose last load is older refuses, naming both."""
    generation, actor, _ = split
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=11)
    rollout = generation.generate(prompt_batch(tokenizer), params)
    update(actor, rollout, step=1)
    published = actor.call(ActorRolloutRefWorker.publish_weights)  # published, but never loaded
    with pytest.raises(WorkerError, match="a weight sync was skipped"):
        generation.pool.call(RolloutWorker.generate_sequences, prompt_batch(tokenizer), params, published[0][0])
    generation.sync_weights()
    assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-4


def test_a_damaged_publication_is_named(split, tokenizer):
    """Fingerprints that do not match what the pool read (as a corrupted arena would give) stop the load with the
    parameter's name, on the rank that read it."""
    generation, actor, _ = split
    published = actor.call(ActorRolloutRefWorker.publish_weights)
    expected = torch.stack([fingerprints for _, fingerprints in published]).sum(0)
    expected[:, 3] += 1
    with pytest.raises(WorkerError, match="arrived different from what was sent: " + generation.layout.names[3]):
        generation.pool.call(RolloutWorker.load_published_weights, generation.layout, expected, published[0][0])
