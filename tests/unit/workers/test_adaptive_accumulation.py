"""Adaptive accumulation in the training loop: which steps are allowed, the sample-clock learning-rate schedule, and
the direction of the moves on a constructed noise-scale sequence (all against hand-computed values)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import AdaptiveAccumulationConfig, OptimConfig
from hybridrl.autotune.adaptive_accumulation import AccumulationControl, ScaledSchedule, allowed_steps
from hybridrl.autotune.grad_noise import GradientNoiseScale, GradientSample, NoiseScaleMonitor, SmallBatchSummary
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.engines.optim import build_scheduler


def sgd_with_warmup(lr: float = 1.0, warmup: int = 4):
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=lr)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=lr, lr_warmup_steps=warmup), total_steps=100)
    return param, optimizer, scheduler


def monitor() -> NoiseScaleMonitor:
    """The measurement a control feeds on in training; these tests feed it constructed estimates instead."""
    return NoiseScaleMonitor(torch.nn.Linear(1, 1), DataParallelGroup())


def test_allowed_steps_divide_the_step_and_keep_the_reference():
    config = AdaptiveAccumulationConfig(enable=True, min_steps=1, max_steps=16)
    # ladder 1, 2, 4, 8, 16 with micro 2: mini-batches 2, 4, 8, 16, 32 — 32 does not divide 48 sequences
    assert allowed_steps(config, reference_steps=4, micro_batch_size=2, local_step_sequences=48) == (1, 2, 4, 8)
    config = AdaptiveAccumulationConfig(enable=True, min_steps=2, max_steps=8)
    # the configured 3 joins the ladder 2, 4, 8; with 24 sequences of micro 1 all divide
    assert allowed_steps(config, reference_steps=3, micro_batch_size=1, local_step_sequences=24) == (2, 3, 4, 8)


def test_scaled_schedule_advances_by_samples_and_scales_the_rate():
    param, optimizer, scheduler = sgd_with_warmup()  # warm-up multipliers 1/4, 2/4, 3/4, then 1
    schedule = ScaledSchedule(optimizer, scheduler)
    schedule.set(2.0, 0.5)  # twice the rate, half a schedule step per optimizer step
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # 0.25 × 2
    rates = []
    for _ in range(4):
        param.grad = torch.zeros(1)
        optimizer.step()
        schedule.step()
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([0.5, 1.0, 1.0, 1.5])  # schedule at 0.25, 0.5, 0.5, 0.75; × 2
    assert scheduler.last_epoch == 2
    schedule.set(0.5, 4.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.375)  # 0.75 × 0.5
    param.grad = torch.zeros(1)
    optimizer.step()
    schedule.step()
    assert scheduler.last_epoch == 6 and optimizer.param_groups[0]["lr"] == pytest.approx(0.5)  # 1 × 0.5


def noise_update(noise: GradientNoiseScale, trace: float) -> None:
    """One step whose exact |G|² = 1 and S = ``trace``: four micro-batches of 10 tokens, a mini-batch of 40."""
    small = SmallBatchSummary(sum_sq_norm=4 * (1 + trace / 10), sum_inverse_batch=4 / 10, count=4)
    noise.update(small, GradientSample(40, 1 + trace / 40))


def test_steps_follow_a_constructed_noise_scale_sequence():
    _, optimizer, scheduler = sgd_with_warmup(warmup=0)
    config = AdaptiveAccumulationConfig(enable=True, min_steps=1, max_steps=8, lr_scaling="sqrt", tolerance=2.0,
                                        min_updates=3)
    control = AccumulationControl.from_config(config, optimizer, scheduler, micro_batch_size=2, reference_steps=2,
                                              world_size=2, local_step_sequences=32, monitor=monitor())
    assert control.rule.allowed_steps() == [1, 2, 4, 8]
    noise = GradientNoiseScale(ema_decay=0.5)
    tokens_per_micro_step = 20
    # Bias-corrected EMA of S (|G|² stays exactly 1, so B_simple is that EMA):
    #   S:        40   40   40   400    400    10     10     10
    #   B_simple: 40   40   40   232    318.7  161.9  85.35  47.53
    # mini-batch (20 tokens per step): 40 → within ×2 keep; 232 > 80 → 11.6 steps wanted → 8 (nearest in log);
    # at 8 steps (160 tokens) 318.7, 161.9, 85.35 are within [80, 320]: keep; 47.53 < 80 → 2.38 steps → 2.
    expected_steps = [2, 2, 2, 8, 8, 8, 8, 2]
    seen_steps, seen_b_simple = [], []
    for trace in (40, 40, 40, 400, 400, 10, 10, 10):
        noise_update(noise, trace)
        control.update(tokens_per_micro_step * control.steps, noise.latest)
        seen_steps.append(control.steps)
        seen_b_simple.append(noise.latest.b_simple)
    assert seen_b_simple == pytest.approx([40, 40, 40, 232, 318.7097, 161.9048, 85.3543, 47.5294], rel=1e-4)
    assert seen_steps == expected_steps
    assert control.schedule.multiplier == pytest.approx(1.0) and control.schedule.steps_per_step == 1.0


def test_a_raise_sets_the_rate_metrics_and_the_schedule_clock():
    _, optimizer, scheduler = sgd_with_warmup(lr=0.1, warmup=0)
    config = AdaptiveAccumulationConfig(enable=True, min_steps=1, max_steps=8, lr_scaling="linear", min_updates=1)
    control = AccumulationControl.from_config(config, optimizer, scheduler, micro_batch_size=2, reference_steps=2,
                                              world_size=2, local_step_sequences=32, monitor=monitor())
    noise = GradientNoiseScale(ema_decay=0.0)
    noise_update(noise, 1000.0)  # B_simple 1000 vs a 40-token mini-batch: 50 steps wanted → 8 (the bound)
    decision = control.update(40, noise.latest)
    assert decision.changed and control.steps == 8 and control.local_mini_batch_size == 16
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4)  # 0.1 × (8 / 2) linear
    assert control.schedule.steps_per_step == 4.0
    assert control.metrics() == {"accumulation/grad_accum_steps": 8.0,
                                 "accumulation/effective_batch_sequences": 32.0,  # 2 × 8 × 2 ranks
                                 "accumulation/lr_multiplier": pytest.approx(4.0)}


def test_bounds_must_contain_the_configured_steps():
    _, optimizer, scheduler = sgd_with_warmup()
    with pytest.raises(ValueError, match=r"\[4, 8\] must contain the configured 2"):
        AccumulationControl.from_config(AdaptiveAccumulationConfig(enable=True, min_steps=4, max_steps=8), optimizer,
                                        scheduler, micro_batch_size=1, reference_steps=2, world_size=1,
                                        local_step_sequences=8, monitor=monitor())
