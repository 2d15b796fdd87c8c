"""LoRA helpers on one process: names, the merge (against PEFT's own merge_and_unload), bad target modules."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import LoraConfig, ModelConfig
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.lora import adapted_layers, hf_name, merge_rows, merged_state_dict
from hybridrl.modeling.model_builder import build_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("lora_unit") / "model")


def lora_model(model_dir, **lora):
    model = build_model(ModelConfig(path=str(model_dir), lora=LoraConfig(rank=2, alpha=6.0, **lora)), "actor")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # fresh adapters have B = 0; give them values so the merge is not trivially W
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    return model


def test_hf_name_strips_peft_prefix_and_base_layer():
    assert hf_name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == \
        "model.layers.0.self_attn.q_proj.weight"
    assert hf_name("base_model.model.lm_head.weight") == "lm_head.weight"


def test_merge_rows_is_row_local():
    weight, lora_b, lora_a = torch.randn(6, 5), torch.randn(6, 2), torch.randn(2, 5)
    full = merge_rows(weight, lora_b, lora_a, 3.0)
    assert torch.allclose(full, weight + 3.0 * lora_b @ lora_a)
    assert torch.allclose(merge_rows(weight[2:4], lora_b[2:4], lora_a, 3.0), full[2:4])


def test_merged_state_dict_equals_peft_merge(model_dir):
    model = lora_model(model_dir, target_modules=["q_proj", "up_proj"])
    layers = adapted_layers(model)
    assert len(layers) == 4 and all(layer.scaling == 3.0 for layer in layers)
    merged = merged_state_dict({name: param.detach() for name, param in model.named_parameters()}, layers)
    reference = model.merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for name, tensor in reference.items():
        assert torch.allclose(merged[name], tensor, atol=1e-6), name


def test_lora_model_starts_as_the_base_model(model_dir):
    plain = build_model(ModelConfig(path=str(model_dir)), "actor")
    adapted = build_model(ModelConfig(path=str(model_dir), lora=LoraConfig(rank=2)), "actor")
    ids = torch.randint(4, 60, (2, 7))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, adapted(input_ids=ids).logits)
    trainable = [name for name, param in adapted.named_parameters() if param.requires_grad]
    assert trainable and all(".lora_" in name for name in trainable)


def test_unknown_target_module_names_the_key(model_dir):
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        build_model(ModelConfig(path=str(model_dir), lora=LoraConfig(rank=2, target_modules=["qkv"])), "actor")
