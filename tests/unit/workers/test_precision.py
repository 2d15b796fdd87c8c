"""Precision modes: bytes per parameter by hand, torchao's 8-bit AdamW on CPU against a slow AdamW written here, its
measured state bytes against the planner's figure, and fp8 compute refused off a Hopper GPU with a clear error."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config import ConfigError
from hybridrl.config.precision import (
    EIGHT_BIT_BLOCK_SIZE,
    check_fp8_compute,
    optimizer_bytes_per_param,
    precision_mode,
    standard_modes,
)
from hybridrl.config.schema import OptimConfig
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.optim import build_optimizer, build_scheduler, clipped_step
from hybridrl.engines.precision import optimizer_state_bytes, tensor_bytes
from hybridrl.modeling.fp8 import apply_fp8_compute


def test_bytes_per_parameter_of_each_mode_by_hand():
    standard, eight_bit, fp8 = standard_modes()
    assert (standard.master_bytes, standard.grad_bytes, standard.optimizer_bytes) == (4, 4, 8.0)
    assert standard.state_bytes_per_param == 16
    assert eight_bit.optimizer_bytes == 2 + 8 / 256 and eight_bit.state_bytes_per_param == pytest.approx(10.03125)
    assert fp8.state_bytes_per_param == 16 and fp8.fp8_matmuls and not standard.fp8_matmuls
    assert precision_mode("bfloat16", "bfloat16", "fp32", False).grad_bytes == 2
    with pytest.raises(ValueError, match="state precision"):
        optimizer_bytes_per_param("4bit")


def slow_adamw(param, grads, *, lr, betas, eps, weight_decay):
    """AdamW written out, one scalar update rule over the whole tensor per step (the reference)."""
    param = param.clone()
    first, second = torch.zeros_like(param), torch.zeros_like(param)
    for step, grad in enumerate(grads, start=1):
        param = param * (1 - lr * weight_decay)
        first = betas[0] * first + (1 - betas[0]) * grad
        second = betas[1] * second + (1 - betas[1]) * grad * grad
        first_hat, second_hat = first / (1 - betas[0] ** step), second / (1 - betas[1] ** step)
        param = param - lr * first_hat / (second_hat.sqrt() + eps)
    return param


def test_8bit_adamw_on_cpu_follows_adamw():
    pytest.importorskip("torchao")
    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 64, bias=True)  # weight: 8192 values (quantised); bias: 64 (kept fp32)
    start = [param.detach().clone() for param in layer.parameters()]
    config = OptimConfig(lr=1e-2, weight_decay=0.1, betas=[0.9, 0.99], eps=1e-8, state_precision="8bit")
    optimizer = build_optimizer(layer, config)
    scheduler = build_scheduler(optimizer, config, total_steps=10)
    grads: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for _ in range(4):
        inputs = torch.randn(16, 128)
        layer(inputs).square().mean().backward()
        for index, param in enumerate(layer.parameters()):
            grads[index].append(param.grad.detach().clone())
        result = clipped_step(layer, optimizer, scheduler, max_norm=1e9)
        assert result.applied and result.lr == pytest.approx(1e-2)
    state = optimizer.state[layer.weight]["exp_avg"]
    assert type(state).__name__ == "OptimState8bit"
    for index, param in enumerate(layer.parameters()):
        expected = slow_adamw(start[index], grads[index], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
        moved = (expected - start[index]).abs().max()
        # 8-bit moments: the update is close to AdamW's, not equal (a few % of the step taken)
        assert (param.detach() - expected).abs().max() < 0.05 * moved
    # the bias is too small to quantise: its update is AdamW's exactly (fp32 moments)
    assert torch.allclose(layer.bias.detach(), slow_adamw(start[1], grads[1], lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
                                                          weight_decay=0.1), atol=1e-6)


def test_8bit_state_bytes_match_the_planner_figure():
    pytest.importorskip("torchao")
    model = build_tiny_model(TinyModelSpec(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                                           intermediate_size=256), 512, pad_token_id=0, eos_token_id=1)
    optimizer = build_optimizer(model, OptimConfig(state_precision="8bit"))
    model(torch.randint(0, 512, (2, 8))).logits.sum().backward()
    optimizer.step()
    quantised = [p.numel() for p in model.parameters() if p.numel() >= 4096 and p.numel() % EIGHT_BIT_BLOCK_SIZE == 0]
    small = sum(p.numel() for p in model.parameters()) - sum(quantised)
    code_book = 256 * 4  # each quantised moment carries its 256-entry fp32 code map
    predicted = optimizer_bytes_per_param("8bit") * sum(quantised) + 8 * small + 2 * code_book * len(quantised)
    assert optimizer_state_bytes(optimizer) == pytest.approx(predicted, rel=1e-6)
    fp32 = build_optimizer(model, OptimConfig())
    fp32.step()
    assert optimizer_state_bytes(fp32) == 8 * sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(optimizer) < 0.3 * optimizer_state_bytes(fp32)


def test_tensor_bytes_of_a_plain_tensor():
    assert tensor_bytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 30


@pytest.mark.parametrize("device,capability,match", [
    ("cpu", None, "this run is on cpu"),
    ("cuda", (8, 0), "this GPU has 8.0"),
])
def test_fp8_compute_is_refused_off_hopper(device, capability, match):
    with pytest.raises(ConfigError, match=match) as raised:
        check_fp8_compute(device, capability)
    assert raised.value.keys == ["model.fp8_compute"]


def test_fp8_compute_refused_when_building_a_cpu_model():
    model = build_tiny_model(TinyModelSpec(), 64, pad_token_id=0, eos_token_id=1)
    with pytest.raises(ConfigError, match="model.fp8_compute"):
        apply_fp8_compute(model, torch.device("cpu"))
    assert not any(type(module).__name__ == "Float8Linear" for module in model.modules())  # nothing converted


@pytest.mark.parametrize("overrides,key", [
    (["actor.optim.state_precision=4bit"], "actor.optim.state_precision"),
    (["model.fp8_compute=true", "trainer.device=cpu"], "model.fp8_compute"),
])
def test_config_refuses_unsupported_precision(overrides, key):
    from hybridrl.config import load_config

    with pytest.raises(ConfigError) as raised:
        load_config(overrides, check_paths=False)
    assert raised.value.keys == [key]
