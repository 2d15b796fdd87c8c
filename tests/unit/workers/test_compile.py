"""``model.use_torch_compile``: compiled decoder layers give the eager loss and gradients (inductor on CPU)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.modeling.model_builder import build_model

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


def test_compiled_layers_under_single_rank_mixed_precision_match_eager(tmp_path):
    """One rank with ``gather_once`` (bf16 casts swapped in by hooks, no FSDP2): compiled layers see the casts as
    inputs — the same loss and fp32 gradients as eager layers, over two micro-batches through one set of casts."""
    from hybridrl.modeling.fsdp import parameters_kept_gathered
    from hybridrl.modeling.single_rank import apply_compute_dtype

    model_dir = save_tiny_model(tmp_path / "model", TinyModelSpec(num_layers=1))
    ids = torch.randint(4, 60, (2, 10), generator=torch.Generator().manual_seed(0))
    results = []
    for compile_layers in (False, True):
        model = build_model(ModelConfig(path=str(model_dir), dtype="bfloat16", use_torch_compile=compile_layers),
                            "actor")
        apply_compute_dtype(model, torch.bfloat16)
        with parameters_kept_gathered(model, through_backward=True):
            losses = [model(input_ids=ids[i:i + 1], labels=ids[i:i + 1], use_cache=False).loss for i in range(2)]
            for loss in losses:
                loss.backward()
        results.append((torch.stack(losses).detach(), {name: p.grad for name, p in model.named_parameters()}))
    (eager_losses, eager_grads), (compiled_losses, compiled_grads) = results
    assert torch.allclose(eager_losses, compiled_losses, atol=2e-2)
    for name, grad in eager_grads.items():
        assert compiled_grads[name].dtype == torch.float32
        assert torch.allclose(grad, compiled_grads[name], rtol=0.05, atol=2e-3), name
