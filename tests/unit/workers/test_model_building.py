"""Model building options that must not change the maths: activation checkpointing, and the attention fallback."""

from __future__ import annotations

import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.model_builder import attention_implementation, build_model


def test_gradient_checkpointing_gives_the_same_gradients(tmp_path):
    model_dir = str(save_tiny_model(tmp_path / "model"))
    plain = build_model(ModelConfig(path=model_dir, dtype="float32"), "actor")
    checkpointed = build_model(ModelConfig(path=model_dir, dtype="float32", enable_gradient_checkpointing=True),
                               "actor")
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    ids = torch.randint(4, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    for model in (plain, checkpointed):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name


def test_flash_attention_falls_back_to_sdpa_without_a_gpu():
    assert attention_implementation("flash_attention_2", "cpu") == "sdpa"
    assert attention_implementation("eager", "cpu") == "eager"
