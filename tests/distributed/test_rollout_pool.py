"""Split placement (``rollout.n_gpus > 0``): a standalone rollout pool of vLLM replicas (CPU build) beside a 1-rank
FSDP trainer, weights published through host shared memory and checked — greedy tokens equal ``transformers``,
rollout log-probs match the trainer's after an update, a skipped sync is refused, a damaged arena is named."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch
from distributed_helpers import cpu_pool, stop
from vllm_helpers import model_dir, tokenizer  # noqa: F401  (module-scoped fixtures)
from test_vllm_tensor_parallel import (MAX_NEW_TOKENS, full_model_bytes, log_prob_gap, prompt_batch,
                                       rank0_slice_bytes, transformers_greedy)

from hybridrl.config import load_config
from hybridrl.protocol import Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerError, WorkerGroup
from hybridrl.replicas.own_processes import ProcessReplica
from hybridrl.replicas.transfer import PublishToReplicas
from hybridrl.trainers.generation import Generation
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker

pytestmark = pytest.mark.distributed


def split_config(model_dir, pool_size: int, tp_size: int, transport: str = "auto"):
    return load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=1",
                        f"rollout.weight_transfer={transport}",
                        "rollout=vllm_cpu", f"rollout.n_gpus={pool_size}", f"rollout.tensor_model_parallel_size={tp_size}",
                        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=4", "actor.optim.lr=1e-2",
                        f"data.max_response_length={MAX_NEW_TOKENS}"])


def start_split(runtime, config, name: str):
    """The trainer's group (1 rank) and the pool's replica groups, as ``RLTrainer`` starts them."""
    actor = WorkerGroup(ActorRolloutRefWorker, cpu_pool(runtime, f"{name}_actor", 1), name=f"{name}_actor",
                        args=(config, 10, False))
    tp_size = config.rollout.tensor_model_parallel_size
    replicas = [WorkerGroup(RolloutWorker, cpu_pool(runtime, f"{name}_rollout{index}", tp_size),
                            name=f"{name}_rollout{index}", args=(config,), tp_size=tp_size)
                for index in range(config.rollout.n_gpus // tp_size)]
    return actor, replicas


def pool_generation(actor, groups) -> Generation:
    """The controller's view of the started groups, as ``hybridrl.replicas.start_generators`` builds it."""
    replicas = [ProcessReplica(group) for group in groups]
    return Generation(replicas, PublishToReplicas(actor, replicas))


@pytest.fixture(scope="module", params=[(1, "shared_memory"),
                                        pytest.param((1, "object_store"), marks=pytest.mark.long),
                                        pytest.param((2, "shared_memory"), marks=pytest.mark.long),
                                        pytest.param((2, "object_store"), marks=pytest.mark.long),
                                        pytest.param((1, "collective"), marks=pytest.mark.long),
                                        pytest.param((2, "collective"), marks=pytest.mark.long)],
                ids=["pool1", "pool1_object_store", "pool2_tp2", "pool2_tp2_object_store", "pool1_collective",
                     "pool2_tp2_collective"])
def split(request, ray_runtime, model_dir):
    """1 trainer rank + one replica of ``t_g = M`` on a pool of ``M``, weights through host shared memory, Ray's
    object store or a gloo group of the trainer's and the replica's ranks (``collective``). The ``t_g = 2`` pools,
    the object store and the collective run with ``make test-long`` (a start took 116 s, and
    79 s, inside the parallel suite, 2026-12-02 and -04; ``test_vllm_tensor_parallel`` keeps a ``t_g = 2`` engine in
    ``make test``, and the colocated replicas in processes of their own, ``test_architectures``' OLMo-2 case, the
    shared-memory publication)."""
    pool_size, transport = request.param
    actor, replicas = start_split(ray_runtime, split_config(model_dir, pool_size, pool_size, transport),
                                  f"split{pool_size}{transport}")
    yield pool_generation(actor, replicas), actor, pool_size
    for group in (*replicas, actor):
        stop(group)


def update(actor, rollout, step: int) -> None:
    rollout = rollout.union(actor.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
        Fields.OLD_LOG_PROBS))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, len(rollout)).unsqueeze(1).expand(
        len(rollout), MAX_NEW_TOKENS).contiguous()
    actor.call(ActorRolloutRefWorker.update_actor, rollout, step=step, temperature=1.0)


def check_greedy_tokens_equal_transformers(split, model_dir, tokenizer):
    """Greedy tokens of the pool, before any update, equal ``transformers``'s."""
    generation, _, _ = split
    rollout = generation.generate(prompt_batch(tokenizer), SamplingParams(max_new_tokens=MAX_NEW_TOKENS,
                                                                          do_sample=False))
    assert torch.equal(rollout[Fields.RESPONSES], transformers_greedy(model_dir, tokenizer))


def check_pool_follows_the_trainer_through_published_weights(split, model_dir, tokenizer):
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
    fetched = generation.transfer.layout.transport in ("object_store", "collective")
    assert stats["weight_sync/bytes"] == (full_model_bytes(model_dir) if fetched else 0)  # fetched whole
    after = generation.generate(prompt_batch(tokenizer), params)
    assert log_prob_gap(actor, after) < 1e-4
    assert log_prob_gap(actor, rollout) > 1e-3


def check_pool_refuses_to_generate_from_weights_it_was_not_given(split, tokenizer):
    """The controller names the version it expects; a pool whose last load is older refuses, naming both."""
    generation, actor, _ = split
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=11)
    rollout = generation.generate(prompt_batch(tokenizer), params)
    update(actor, rollout, step=1)
    if generation.transfer.layout.transport != "collective":  # a collective publication is always paired with its load
        actor.call(ActorRolloutRefWorker.publish_weights)  # published, but never loaded
    asked = generation.policy_version + 1
    with pytest.raises(WorkerError, match=f"holds the weights of version {asked - 1} but generation asked for "
                                          f"version {asked}: a weight sync was skipped"):
        generation.replicas[0].group.call(RolloutWorker.generate_sequences, prompt_batch(tokenizer), params, asked)
    generation.sync_weights()
    assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-4


def check_a_damaged_publication_is_named(split, tokenizer):
    """Fingerprints that do not match what the pool read (as a corrupted arena would give) stop the load with the
    parameter's name, on the rank that read it."""
    generation, actor, _ = split
    published = actor.call(ActorRolloutRefWorker.publish_weights, None, generation.policy_version + 1)
    expected = torch.stack([publication.expected for publication in published]).sum(0)
    expected[:, 3] += 1
    rows = [reference for publication in published for reference in publication.rows]
    with pytest.raises(WorkerError, match="arrived different from what was sent: " + generation.transfer.layout.names[3]):
        generation.replicas[0].group.call(RolloutWorker.load_published_weights, generation.transfer.layout, expected,
                                    generation.policy_version + 1, rows)


def test_split_pool(split, model_dir, tokenizer):
    """The checks above, in their order, on one pool per layout. One test per layout, not four: the pool's start is
    most of the cost (50-95 s inside the parallel suite), and work stealing split the four tests of a layout over
    workers, each starting its own pool (5 starts instead of 2 in a clean-clone run, 2026-12-02)."""
    check_greedy_tokens_equal_transformers(split, model_dir, tokenizer)  # first: before any update
    check_pool_follows_the_trainer_through_published_weights(split, model_dir, tokenizer)
    check_pool_refuses_to_generate_from_weights_it_was_not_given(split, tokenizer)
    check_a_damaged_publication_is_named(split, tokenizer)


@pytest.mark.long
@pytest.mark.parametrize("transport", ["shared_memory", "collective"])
def test_a_dead_replica_is_reported_and_its_prompts_resubmitted(ray_runtime, model_dir, tokenizer, caplog, transport):
    """Two replicas of t_g = 1; one is killed (SIGKILL). The next batch still gets every response: the dead
    replica's chunk goes to the live one with the chunk's own seed, so the samples are the ones it would have
    drawn; the loss is logged and counted, and weights still sync into the survivor (over a process group, the
    dead replica's channel is abandoned, not waited on)."""
    actor, replicas = start_split(ray_runtime, split_config(model_dir, 2, 1, transport), f"resubmit_{transport}")
    try:
        generation = pool_generation(actor, replicas)
        params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=5)
        both = generation.generate(prompt_batch(tokenizer), params)
        os.kill(replicas[1].locations[0].pid, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="hybridrl.trainers.generation"):
            survivor_only = generation.generate(prompt_batch(tokenizer), params)
        assert torch.equal(survivor_only[Fields.RESPONSES], both[Fields.RESPONSES])
        assert torch.equal(survivor_only[Fields.ROLLOUT_LOG_PROBS], both[Fields.ROLLOUT_LOG_PROBS])
        assert f"resubmit_{transport}_rollout1" in caplog.text
        assert f"resubmitted to 'resubmit_{transport}_rollout0'" in caplog.text
        assert "rank 0" in caplog.text
        update(actor, both, step=0)
        stats = generation.sync_weights()
        assert (stats["rollout/replicas_live"], stats["rollout/replicas_lost"]) == (1.0, 1.0)
        assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-4
    finally:
        for group in (*replicas, actor):
            stop(group)


@pytest.mark.long
def test_a_replica_that_dies_unnoticed_does_not_stop_a_collective_sync(ray_runtime, model_dir, tokenizer, caplog):
    """A replica killed between two syncs, with no generation in between to notice it: the next publication posts
    to (or fails on) its channel, its load fails, it is counted lost, and the survivor has the new weights; the
    sync after that abandons its channel instead of waiting on it."""
    actor, replicas = start_split(ray_runtime, split_config(model_dir, 2, 1, "collective"), "unnoticed")
    try:
        generation = pool_generation(actor, replicas)
        params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=5)
        rollout = generation.generate(prompt_batch(tokenizer), params)
        os.kill(replicas[1].locations[0].pid, signal.SIGKILL)
        update(actor, rollout, step=0)
        stats = generation.sync_weights()
        assert (stats["rollout/replicas_live"], stats["rollout/replicas_lost"]) == (1.0, 1.0)
        assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-4
        update(actor, rollout, step=1)
        generation.sync_weights()
        assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-4
    finally:
        for group in (*replicas, actor):
            stop(group)


@pytest.mark.long
def test_delta_syncs_through_the_object_store_keep_a_pool_on_the_trainers_weights(ray_runtime, model_dir, tokenizer):
    """``rollout.weight_delta`` in a real pool (bf16, where a small step leaves most values' bits alone): every
    sync's fingerprints match (``verify_weight_sync``: a wrong delta would stop the load, naming the parameter),
    the first and every third publication go whole and the others carry a fraction of the bytes, and the pool
    samples as the trainer scores."""
    config = load_config([f"model.path={model_dir}", "model.dtype=bfloat16", "trainer.n_gpus_per_node=1",
                          "rollout=vllm_cpu", "rollout.n_gpus=1", "rollout.weight_transfer=object_store",
                          "rollout.weight_delta=true", "rollout.weight_delta_full_every=3", "data.train_batch_size=4",
                          "rollout.n=2", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=4",
                          "actor.optim.lr=1e-6", f"data.max_response_length={MAX_NEW_TOKENS}"])
    actor, replicas = start_split(ray_runtime, config, "delta")
    try:
        generation = pool_generation(actor, replicas)
        params = SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=3)
        whole = full_model_bytes(model_dir) // 2  # bf16
        fetched = []
        for step in range(4):
            rollout = generation.generate(prompt_batch(tokenizer), params)
            update(actor, rollout, step=step)
            stats = generation.sync_weights()
            assert stats["weight_sync/delivered_bytes"] == whole
            fetched.append(stats["weight_sync/bytes"])
        assert fetched[0] == fetched[3] == whole, fetched
        assert 0 < fetched[1] < whole / 2 and 0 < fetched[2] < whole / 2, fetched
        assert log_prob_gap(actor, generation.generate(prompt_batch(tokenizer), params)) < 1e-2
    finally:
        for group in (*replicas, actor):
            stop(group)
