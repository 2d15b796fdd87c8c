"""The colocated worker with LoRA on 2 Ray CPU ranks: vLLM rollout fed merged weights, reference = base model,
HF export = merged model. References are plain transformers models loaded in this process."""

from __future__ import annotations

import pytest
import torch
from distributed_helpers import cpu_pool, stop
from safetensors.torch import load_file
from test_actor_worker import prompt_batch
from transformers import AutoModelForCausalLM

from hybridrl.config import load_config
from hybridrl.runtime import WorkerGroup
from hybridrl.protocol import Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.modeling.sequences import response_log_probs

pytestmark = pytest.mark.distributed

RESPONSE = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lora_worker") / "model")


@pytest.fixture(scope="module")
def lora_group(ray_runtime, model_dir):
    config = load_config([f"model.path={model_dir}", "model.dtype=float32", "trainer.n_gpus_per_node=2",
                          "rollout=vllm_cpu", "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4",
                          "actor.ppo_micro_batch_size_per_gpu=2", "actor.optim.lr=5e-2", "actor.use_kl_loss=true",
                          f"data.max_response_length={RESPONSE}", "model.lora.rank=4", "model.lora.alpha=8"])
    group = WorkerGroup(ActorRolloutRefWorker, cpu_pool(ray_runtime, "lora_pool", 2), name="actor_rollout_lora",
                        args=(config, 10, True))
    yield group
    stop(group)


def plain_log_probs(model, rollout):
    with torch.no_grad():
        values, _ = response_log_probs(model, rollout[Fields.INPUT_IDS], rollout[Fields.ATTENTION_MASK], RESPONSE,
                                       temperature=1.0)
    return values


def max_gap(a, b, rollout):
    return float((a - b).abs()[rollout[Fields.RESPONSE_MASK].bool()].max())


def test_lora_update_sync_reference_and_export(lora_group, model_dir, tmp_path):
    call = lora_group.call
    params = SamplingParams(n=2, max_new_tokens=RESPONSE, temperature=1.0, seed=11)
    rollout = call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir), params)
    rollout = rollout.union(call(ActorRolloutRefWorker.compute_log_prob, rollout, 1.0).select(Fields.OLD_LOG_PROBS))
    rollout = rollout.union(call(ActorRolloutRefWorker.compute_ref_log_prob, rollout, 1.0))
    rollout[Fields.ADVANTAGES] = torch.linspace(-1, 1, 8).unsqueeze(1).expand(8, RESPONSE).contiguous()
    for step in range(3):
        call(ActorRolloutRefWorker.update_actor, rollout, step=step, temperature=1.0)
    assert call(ActorRolloutRefWorker.sync_rollout_weights)["weight_sync/bytes"] > 0

    after = call(ActorRolloutRefWorker.generate_sequences, prompt_batch(model_dir), params)
    actor = call(ActorRolloutRefWorker.compute_log_prob, after, 1.0)[Fields.OLD_LOG_PROBS]
    reference = call(ActorRolloutRefWorker.compute_ref_log_prob, after, 1.0)[Fields.REF_LOG_PROBS]
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base_log_probs = plain_log_probs(base, after)
    assert max_gap(reference, base_log_probs, after) < 1e-5  # reference = base, adapters disabled
    assert max_gap(actor, base_log_probs, after) > 1e-3  # the adapters moved the policy
    assert max_gap(after[Fields.ROLLOUT_LOG_PROBS], actor, after) < 1e-4  # vLLM holds the merged weights

    export_dir = call(ActorRolloutRefWorker.export_hf, str(tmp_path / "hf"))
    assert not any("lora" in name for name in load_file(f"{export_dir}/model.safetensors"))
    exported = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32)
    assert max_gap(plain_log_probs(exported, after), actor, after) < 1e-5
