"""The optimizer step: warm-up and cosine schedule by hand, clipping, and a non-finite gradient skipping the step."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.config.schema import OptimConfig
from hybridrl.engines.optim import build_optimizer, build_scheduler, clipped_step, lr_multiplier


def test_warmup_then_cosine_by_hand():
    values = [lr_multiplier(step, warmup=2, total_steps=6, schedule="cosine", min_lr_ratio=0.1) for step in range(7)]
    assert values[:2] == [0.5, 1.0]
    assert values[2] == pytest.approx(1.0)
    assert values[4] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert values[6] == pytest.approx(0.1)
    assert lr_multiplier(5, warmup=0, total_steps=6, schedule="constant", min_lr_ratio=0.0) == 1.0


def test_clipping_reports_the_pre_clip_norm_and_bounds_the_update():
    model = torch.nn.Linear(4, 1, bias=False)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.0))
    scheduler = build_scheduler(optimizer, OptimConfig(lr=0.1), total_steps=10)
    model.weight.grad = torch.full_like(model.weight, 3.0)  # norm 6
    result = clipped_step(model, optimizer, scheduler, max_norm=1.0)
    assert result.applied and result.grad_norm == pytest.approx(6.0)
    assert model.weight.grad is None  # zeroed for the next step


def test_non_finite_gradient_skips_the_step_and_keeps_the_weights():
    model = torch.nn.Linear(4, 1)
    optimizer = build_optimizer(model, OptimConfig(lr=0.1))
    scheduler = build_scheduler(optimizer, OptimConfig(lr=0.1), total_steps=10)
    before = [param.detach().clone() for param in model.parameters()]
    model.weight.grad = torch.full_like(model.weight, float("nan"))
    model.bias.grad = torch.ones_like(model.bias)
    result = clipped_step(model, optimizer, scheduler, max_norm=1.0)
    assert not result.applied and not math.isfinite(result.grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert scheduler.last_epoch == 0  # the schedule does not advance on a skipped step


def test_the_adamw_step_is_the_textbook_update():
    """The optimizer against AdamW written out by hand for three steps, decoupled weight decay included, in float64
    on the same gradients."""
    from hybridrl.engines.precision import build_adamw

    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(257))
    reference = param.detach().double().clone()
    optimizer = build_adamw([param], lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, state_precision="fp32",
                            device_type="cpu")
    assert optimizer.defaults["fused"]
    first, second = torch.zeros_like(reference), torch.zeros_like(reference)
    for step in range(1, 4):
        grad = torch.randn(257)
        param.grad = grad
        optimizer.step()
        reference *= 1 - 1e-2 * 0.1
        first = 0.9 * first + 0.1 * grad.double()
        second = 0.99 * second + 0.01 * grad.double() ** 2
        denominator = (second / (1 - 0.99 ** step)).sqrt() + 1e-8
        reference -= 1e-2 * (first / (1 - 0.9 ** step)) / denominator
    assert torch.allclose(param.detach().double(), reference, rtol=0, atol=1e-6)
