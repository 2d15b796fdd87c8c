"""The planner counts what it plans: mixture-of-experts models with every expert (``autotune/decoder_shape.py``: the
shape's parameter count equals the real model's, built by transformers on the meta device, for Mixtral, Qwen2-MoE and
Qwen3-MoE; an MoE layout it does not know is refused by name), and every pool (a standalone rollout pool's devices)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.config import ConfigError
from hybridrl.planner.known_models import model_shape

SMALL = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
             intermediate_size=96)
CONFIGS = {
    "llama": dict(model_type="llama"),
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen3_moe": dict(model_type="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      head_dim=16, mlp_only_layers=[0]),
}


def hf_config(model_type: str, **settings):
    return AutoConfig.for_model(model_type, **settings)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_shape_counts_what_transformers_builds(name):
    settings = dict(CONFIGS[name])
    config = hf_config(settings.pop("model_type"), **SMALL, **settings)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    built = sum(parameter.numel() for parameter in model.parameters())
    shape = DecoderShape.from_hf_config(config)
    assert shape.num_parameters() == built, name
    assert shape.is_moe == (name != "llama")


def test_qwen3_30b_a3b_is_planned_with_its_experts():
    """Its published sizes: 30.5 B parameters held (≈ 57 GiB in bf16, not the 6 GiB of a dense 3 B model), a token
    through 8 of 128 experts."""
    config = hf_config("qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
                       num_key_value_heads=4, head_dim=128, vocab_size=151936, intermediate_size=6144,
                       moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8, tie_word_embeddings=False)
    shape = DecoderShape.from_hf_config(config)
    assert 30.3e9 < shape.num_parameters() < 30.7e9
    assert 56 < 2 * shape.num_parameters() / 2**30 < 58
    assert shape.active_intermediate_size == 8 * 768


def test_an_expert_layout_the_planner_does_not_count_is_refused_naming_the_key(tmp_path):
    config = hf_config("deepseek_v3", **SMALL, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    with pytest.raises(ValueError, match="model_type='deepseek_v3' has experts laid out"):
        DecoderShape.from_hf_config(config)
    config.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model.path=.*experts laid out in a way the memory model does not count"):
        model_shape(str(tmp_path), "model.path")


# --- every pool: a standalone rollout pool's devices are planned and paid for --------------------------------------


def pool_job(*overrides):
    from hybridrl.config import load_config

    return load_config(["model.path=/nonexistent", "data.max_prompt_length=1024", "data.max_response_length=1024",
                        "data.train_batch_size=64", "rollout.n=4", "actor.ppo_mini_batch_size=64",
                        "actor.ppo_micro_batch_size_per_gpu=4", "trainer.n_gpus_per_node=4", "model.dtype=bfloat16",
                        "rollout.name=vllm", "trainer.device=cuda", "trainer.total_training_steps=10", *overrides],
                       check_paths=False)


def test_a_standalone_pool_is_planned_on_its_own_devices_and_counted_in_the_cost():
    from hybridrl.planner import Shapes, gpu_spec, plan_job

    shape = DecoderShape.from_hf_config(hf_config("qwen2", hidden_size=896, num_hidden_layers=24,
                                                  num_attention_heads=14, num_key_value_heads=2,
                                                  intermediate_size=4864, vocab_size=151936))
    gpu, shapes = gpu_spec("a100-80"), Shapes(shape)
    colocated = plan_job(pool_job(), gpu, shapes=shapes, price_per_gpu_hour=2.0, keep_layout=True)  # same TP
    pooled = plan_job(pool_job("rollout.n_gpus=4"), gpu, shapes=shapes, price_per_gpu_hour=2.0)
    engine = pooled.as_configured.roles["rollout"].total
    # the trainer's devices no longer hold the engine; a pool device holds it and its CUDA context
    assert colocated.as_configured.phases["generate"] - pooled.as_configured.phases["generate"] == engine
    assert pooled.as_configured.phases["generate_on_pool"] > engine
    assert "generate_on_pool" not in colocated.as_configured.phases
    # 4 + 4 devices are paid for; generation runs on the pool's 4 replicas, as colocated on the trainer's 4
    assert (colocated.num_devices, pooled.num_devices) == (4, 8)
    assert pooled.cost == pytest.approx(2.0 * 8 * pooled.hours)
    assert pooled.step_time.phases["generate"] == pytest.approx(colocated.step_time.phases["generate"])
    fewer = plan_job(pool_job("rollout.n_gpus=2"), gpu, shapes=shapes)
    assert fewer.step_time.phases["generate"] > pooled.step_time.phases["generate"]  # 2 replicas, not 4


def test_an_engine_in_its_own_process_on_the_actors_device_adds_a_cuda_context():
    from hybridrl.planner import Shapes, gpu_spec, plan_job
    from hybridrl.planner.memory_plan import CUDA_CONTEXT_BYTES

    shape, gpu = DecoderShape(24, 896, 4864, 14, 2, 64, 151936), gpu_spec("a100-80")
    in_actor = plan_job(pool_job(), gpu, shapes=Shapes(shape)).as_configured.roles["rollout"]
    own = plan_job(pool_job("rollout.engine_process=own"), gpu, shapes=Shapes(shape)).as_configured.roles["rollout"]
    assert own.total - in_actor.total == CUDA_CONTEXT_BYTES
    assert "in its own process" in own.note and "in the actor's process" in in_actor.note
