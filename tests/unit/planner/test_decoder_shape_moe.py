"""Mixture-of-experts models are counted with every expert (``autotune/decoder_shape.py``): the shape's parameter
count equals the real model's, built by transformers on the meta device, for Mixtral, Qwen2-MoE (shared expert,
dense layers between sparse ones) and Qwen3-MoE; an MoE layout it does not know is refused by name."""

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
