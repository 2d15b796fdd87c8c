"""The colocated actor/rollout/reference worker on 2 Ray CPU ranks (real FSDP2 over gloo, real tiny model)."""

from __future__ import annotations

import pytest
import torch
from distributed_helpers import cpu_pool, stop
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config import load_config
from hybridrl.runtime import WorkerError, WorkerGroup, gather
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import encode_chat, save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.modeling.sequences import response_log_probs

pytestmark = pytest.mark.distributed

PROMPTS = ["12+34=", "7*8=", "100-1=", "5+5="]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("actor_worker") / "model")


def worker_config(model_dir, dtype="float32"):
    return load_config([f"model.path={model_dir}", f"model.dtype={dtype}", "trainer.n_gpus_per_node=2",
                        "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=2", "actor.optim.lr=1e-2", "actor.use_kl_loss=true",
                        "data.max_response_length=6"])


def prompt_batch(model_dir) -> Batch:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, PROMPTS)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]},
                 non_tensors={Fields.UID: [f"p{i}" for i in range(len(PROMPTS))]})


@pytest.fixture(scope="module")
def actor_group(ray_runtime, model_dir):
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "actor_pool", 2), name="actor_rollout_ref",
                        args=(worker_config(model_dir), 10, True))
    yield group
    stop(group)


def test_generate_then_log_probs_match_rollout(actor_group, model_dir):
    rollout = actor_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir),
                               SamplingParams(n=2, max_new_tokens=6, temperature=0.8, seed=3))
    assert len(rollout) == 8 and rollout[Fields.RESPONSES].shape == (8, 6)
    assert list(rollout[Fields.UID]) == ["p0", "p0", "p1", "p1", "p2", "p2", "p3", "p3"]
    old, ref = gather(actor_group.call_async(ActorRolloutRefWorker.compute_log_prob, rollout, 0.8),
                      actor_group.call_async(ActorRolloutRefWorker.compute_ref_log_prob, rollout, 0.8))
    mask = rollout[Fields.RESPONSE_MASK].bool()
    gap = (old[Fields.OLD_LOG_PROBS] - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask]
    assert float(gap.max()) < 1e-4  # the numerics gate: trainer and rollout agree on the same tokens
    assert torch.allclose(old[Fields.OLD_LOG_PROBS], ref[Fields.REF_LOG_PROBS], atol=1e-5)  # not yet updated


def test_update_changes_policy_and_export_loads_in_transformers(actor_group, model_dir, tmp_path):
    rollout = actor_group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir),
                               SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=5))
    rollout = rollout.union(actor_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(
        Fields.OLD_LOG_PROBS))
    rollout = rollout.union(actor_group.call(ActorRolloutRefWorker.compute_ref_log_prob, rollout, 1.0))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, 8).unsqueeze(1).expand(8, 6).contiguous()
    before = actor_group.call(ActorRolloutRefWorker.parameter_checksum)
    metrics = actor_group.call(ActorRolloutRefWorker.update_actor, rollout, step=0, temperature=1.0)
    assert len(metrics) == 2 and metrics[0] == metrics[1]  # metrics are reduced across ranks inside the worker
    assert all(torch.isfinite(torch.tensor(value)) for value in metrics[0].values())
    assert metrics[0]["skipped_step"] == 0 and metrics[0]["grad_norm"] > 0
    assert actor_group.call(ActorRolloutRefWorker.parameter_checksum) != before

    export_dir = actor_group.call(ActorRolloutRefWorker.export_hf, str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    worker_log_probs = actor_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)[Fields.OLD_LOG_PROBS]
    with torch.no_grad():
        plain, _ = response_log_probs(exported, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], 6,
                                      temperature=1.0)
    mask = rollout[Fields.RESPONSE_MASK].bool()
    assert float((plain - worker_log_probs).abs()[mask].max()) < 1e-5


def vllm_config_args(model_dir) -> tuple:
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          "rollout=vllm_cpu", "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                          "actor.ppo_micro_batch_size_per_gpu=2", "actor.optim.lr=1e-2", "data.max_response_length=6"])
    return config, 10, False


@pytest.fixture(scope="module")
def vllm_group(ray_runtime, model_dir):
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "vllm_pool", 2), name="actor_rollout_vllm",
                        args=vllm_config_args(model_dir))
    yield group
    stop(group)


def test_vllm_engine_in_the_colocated_worker_follows_updates(vllm_group, model_dir):
    """The hybrid engine with a separate vLLM copy: after an update and a resharded sync, vLLM's log-probs of its own
    samples match the trainer's on the new weights (the per-step numerics gate)."""
    prompts = prompt_batch(model_dir)
    rollout = vllm_group.call(ActorRolloutRefWorker.generate_sequences, prompts,
                              SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=7))
    old = vllm_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)
    mask = rollout[Fields.RESPONSE_MASK].bool()
    assert float((old[Fields.OLD_LOG_PROBS] - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max()) < 1e-4
    rollout = rollout.union(old.select(Fields.OLD_LOG_PROBS))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, 8).unsqueeze(1).expand(8, 6).contiguous()
    vllm_group.call(ActorRolloutRefWorker.update_actor, rollout, step=0, temperature=1.0)
    stats = vllm_group.call(ActorRolloutRefWorker.sync_rollout_weights)
    assert stats["weight_sync/bytes"] > 0
    after = vllm_group.call(ActorRolloutRefWorker.generate_sequences, prompts,
                            SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=7))
    new = vllm_group.call(ActorRolloutRefWorker.compute_log_prob, after, 1.0)
    mask = after[Fields.RESPONSE_MASK].bool()
    assert float((new[Fields.OLD_LOG_PROBS] - after[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max()) < 1e-4
    # The policy did change, so matching after the sync is not vacuous: a stale engine would be off by this much.
    changed = vllm_group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)[Fields.OLD_LOG_PROBS]
    assert float((changed - rollout[Fields.OLD_LOG_PROBS]).abs()[rollout[Fields.RESPONSE_MASK].bool()].max()) > 1e-3


@pytest.mark.long  # a vLLM worker group of its own: 87 s inside the parallel suite, 18 s alone (2026-12-02)
def test_vllm_engine_started_with_dummy_weights_gets_the_actors_on_sync(ray_runtime, model_dir):
    """``rollout.load_format=dummy`` (verl's usual setting): the engine starts from random weights, so generating
    before the first sync is refused (the trainer syncs first); one resharded sync makes its log-probs agree."""
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          "rollout=vllm_cpu", "rollout.load_format=dummy", "data.train_batch_size=4", "rollout.n=2",
                          "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=2",
                          "data.max_response_length=6"])
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "vllm_dummy_pool", 2), name="actor_vllm_dummy",
                        args=(config, 10, False))
    try:
        params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=7)
        with pytest.raises(WorkerError, match=r"random weights \(rollout.load_format=dummy\)"):
            group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir), params)
        group.call(ActorRolloutRefWorker.sync_rollout_weights)
        rollout = group.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir), params)
        trainer = group.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)[Fields.OLD_LOG_PROBS]
        mask = rollout[Fields.RESPONSE_MASK].bool()
        assert float((trainer - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max()) < 1e-4
    finally:
        stop(group)


def test_a_vllm_engine_rebuilt_in_the_parked_processes_matches_its_trainer(vllm_group, model_dir):
    """The group's processes are parked when it shuts down (``hybridrl.runtime.parked``), and the next group on its
    devices starts in them: vLLM keeps process groups in module state, and a rebuilt engine must not find the old
    ones. The rebuilt engine's log-probs of its own samples match the rebuilt trainer's (the numerics gate). Stops
    the module's vLLM group: keep this test last."""
    pids = [location.pid for location in vllm_group.locations]
    vllm_group.shutdown()
    again = WorkerGroup(ActorRolloutRefWorker, vllm_group.pool, name="actor_rollout_vllm_again",
                        args=vllm_config_args(model_dir))
    try:
        assert [location.pid for location in again.locations] == pids
        rollout = again.call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir),
                             SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=7))
        trainer = again.call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0)[Fields.OLD_LOG_PROBS]
        mask = rollout[Fields.RESPONSE_MASK].bool()
        assert float((trainer - rollout[Fields.ROLLOUT_LOG_PROBS]).abs()[mask].max()) < 1e-4
    finally:
        again.shutdown()
