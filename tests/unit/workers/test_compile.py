"""``model.use_torch_compile``: compiled decoder layers give the eager loss and gradients (inductor on CPU)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.workers.model_builder import build_model

pytestmark = pytest.mark.slow


def test_compiled_layers_match_eager(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(num_layers=1))
    eager = build_model(ModelConfig(path=str(model_dir), dtype="float32"), "actor")
    compiled = build_model(ModelConfig(path=str(model_dir), dtype="float32", use_torch_compile=True), "actor")
    assert any(getattr(layer, "_compiled_call_impl", None) is not None for layer in compiled.modules())
    ids = torch.randint(4, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    losses = []
    for model in (eager, compiled):
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        losses.append(loss.detach())
    assert torch.allclose(losses[0], losses[1], atol=1e-5)
    for (name, eager_param), compiled_param in zip(eager.named_parameters(), compiled.parameters()):
        assert torch.allclose(eager_param.grad, compiled_param.grad, atol=1e-5), name
