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


def test_a_mini_batch_with_nothing_in_the_loss_takes_no_step(tmp_path):
    """Every row fully masked (an agent's unused rows, failed episodes): AdamW would still move the weights (momentum,
    weight decay) on zero gradients, so no optimizer or schedule step is taken, and the step says so."""
    from transformers import AutoModelForCausalLM

    from hybridrl.config.schema import OptimConfig
    from hybridrl.engines.base import TrainingEngine
    from hybridrl.engines.losses import SequenceForward, SFTLoss
    from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
    from hybridrl.engines.optim import build_optimizer, build_scheduler
    from hybridrl.protocol import Batch, Fields
    from hybridrl.utils.tiny_model import save_tiny_model

    model = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp_path / "model"), dtype=torch.float32)
    config = OptimConfig(lr=1e-2, weight_decay=0.1)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 10)
    engine = TrainingEngine(model, dp=DataParallelGroup(), micro_batching=MicroBatching(micro_batch_size=2),
                            optimizer=optimizer, scheduler=scheduler)
    ids = torch.randint(4, 40, (2, 6))
    rows = Batch(tensors={Fields.INPUT_IDS: ids, Fields.ATTENTION_MASK: torch.ones_like(ids),
                          Fields.RESPONSES: ids[:, 3:], Fields.RESPONSE_MASK: torch.ones_like(ids[:, 3:])})
    loss = SFTLoss(SequenceForward())
    assert engine.optimizer_step(rows, loss)["empty_step"] == 0.0  # a real step first: AdamW has momentum now
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    steps_before = scheduler.last_epoch
    rows[Fields.RESPONSE_MASK] = torch.zeros_like(ids[:, 3:])
    metrics = engine.optimizer_step(rows, loss)
    assert metrics["empty_step"] == 1.0 and metrics["skipped_step"] == 0.0 and scheduler.last_epoch == steps_before
    assert all(torch.equal(param, before[name]) for name, param in model.named_parameters())
