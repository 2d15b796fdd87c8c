"""Gradient-noise scale: the estimator against a problem whose noise scale is known in closed form, the per-micro-batch
gradient hooks against independently computed gradients, and the EMA / adaptive rule by hand.

The synthetic problem: linear regression ``y = xᵀw* + ε`` with ``x ~ N(0, I_d)``, ``ε ~ N(0, σ²)`` and loss
``½(xᵀw − y)²`` at a fixed ``w = w* + δ``. The per-sample gradient is ``g = x xᵀ δ − x ε``, so ``G = E[g] = δ`` and
(Isserlis for Gaussian fourth moments) ``E[g gᵀ] = 2δδᵀ + (|δ|² + σ²) I``, giving
``tr Σ = |δ|² + d(|δ|² + σ²)`` and ``B_simple = tr Σ / |δ|²``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.autotune.adaptive_accumulation import AdaptiveAccumulation
from hybridrl.autotune.grad_noise import (
    GradientNoiseScale,
    GradientSample,
    MicroBatchGradNorms,
    NoiseScaleEstimate,
    NoiseScaleMonitor,
    SmallBatchSummary,
    summarize,
    unbiased_estimates,
)
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching
from hybridrl.modeling.sequences import response_log_probs

DIM, SIGMA = 8, 1.0


def regression_problem(seed=0):
    generator = torch.Generator().manual_seed(seed)
    delta = torch.randn(DIM, generator=generator, dtype=torch.float64)
    delta = delta / delta.norm()  # |G|² = 1
    trace = 1.0 + DIM * (1.0 + SIGMA ** 2)
    return generator, delta, trace  # B_simple = trace / 1


def sample_gradients(generator, delta, count):
    """``[count, d]`` per-sample gradients ``x (xᵀδ − ε)`` (w* = 0)."""
    x = torch.randn(count, DIM, generator=generator, dtype=torch.float64)
    noise = SIGMA * torch.randn(count, generator=generator, dtype=torch.float64)
    return x * (x @ delta - noise).unsqueeze(-1)


@pytest.mark.parametrize("sizes", [(4,) * 8, (2, 3, 5, 6, 8, 8)], ids=["equal-micro-batches", "ragged"])
def test_estimator_converges_to_the_known_noise_scale(sizes):
    generator, delta, trace = regression_problem()
    steps, total = 3000, sum(sizes)
    noise = GradientNoiseScale(ema_decay=0.99)
    raw_gradient_sq, raw_trace = [], []
    per_sample = sample_gradients(generator, delta, steps * total).view(steps, total, DIM)
    bounds = torch.tensor((0, *sizes)).cumsum(0).tolist()
    for step in range(steps):
        grads = per_sample[step]
        small = [GradientSample(end - start, float(grads[start:end].mean(0).pow(2).sum()))
                 for start, end in zip(bounds[:-1], bounds[1:])]
        estimate = noise.update(small, GradientSample(total, float(grads.mean(0).pow(2).sum())))
        raw_gradient_sq.append(estimate.raw_gradient_sq)
        raw_trace.append(estimate.raw_trace)
    # unbiased per step: the long-run means converge to the truth
    assert sum(raw_gradient_sq) / steps == pytest.approx(1.0, rel=0.05)
    assert sum(raw_trace) / steps == pytest.approx(trace, rel=0.05)
    # the EMAs (window ~100 steps) are within the estimator's noise of the truth
    assert estimate.b_simple == pytest.approx(trace, rel=0.2)
    assert estimate.num_updates == steps


def test_paper_formulas_for_two_sizes():
    small, big = GradientSample(2, 5.0), GradientSample(8, 2.0)
    gradient_sq, trace = unbiased_estimates(SmallBatchSummary.of([small]), big)
    assert gradient_sq == pytest.approx((8 * 2.0 - 2 * 5.0) / (8 - 2))  # (B|G_B|² − b|G_b|²) / (B − b) = 1
    assert trace == pytest.approx((5.0 - 2.0) / (1 / 2 - 1 / 8))  # (|G_b|² − |G_B|²) / (1/b − 1/B) = 8
    # several equal small batches: their mean enters the same formulas
    pair = [GradientSample(2, 4.0), GradientSample(2, 6.0)]
    assert unbiased_estimates(SmallBatchSummary.of(pair), big) == pytest.approx((gradient_sq, trace))


def test_same_sizes_are_unobservable():
    with pytest.raises(ValueError, match="smaller than the big one"):
        unbiased_estimates(SmallBatchSummary.of([GradientSample(8, 1.0)]), GradientSample(8, 1.0))
    with pytest.raises(ValueError, match="smaller than the big one"):
        unbiased_estimates(SmallBatchSummary.of([]), GradientSample(8, 1.0))


def test_ema_with_bias_correction_by_hand():
    noise = GradientNoiseScale(ema_decay=0.5)
    big = GradientSample(4, 1.0)
    # small |G_2|² = 1 + S/2 − ... choose raw values directly through the formulas:
    first = noise.update([GradientSample(2, 3.0)], big)  # S = (3 − 1)/(1/2 − 1/4) = 8, |G|² = 1 − 8/4 = −1
    assert (first.raw_trace, first.raw_gradient_sq) == pytest.approx((8.0, -1.0))
    assert (first.trace, first.gradient_sq) == pytest.approx((8.0, -1.0))  # corrected: 4 / (1 − 0.5)
    assert first.b_simple == math.inf  # the smoothed |G|² is not positive
    second = noise.update([GradientSample(2, 2.0)], big)  # S = 4, |G|² = 0
    # ema: 0.5·4 + 0.5·4 = 4 → /0.75; ema |G|²: 0.5·(−0.5) + 0 = −0.25 → /0.75
    assert second.trace == pytest.approx(4.0 / 0.75)
    assert second.gradient_sq == pytest.approx(-0.25 / 0.75)
    third = noise.update([GradientSample(2, 1.5)], GradientSample(4, 1.25))  # S = 1, |G|² = 1
    assert third.gradient_sq == pytest.approx((0.5 * -0.25 + 0.5 * 1.0) / 0.875)
    assert third.trace == pytest.approx((0.5 * 4.0 + 0.5 * 1.0) / 0.875)
    assert third.b_simple == pytest.approx(third.trace / third.gradient_sq)
    restored = GradientNoiseScale()
    restored.load_state_dict(noise.state_dict())
    assert restored.update([GradientSample(2, 1.5)], GradientSample(4, 1.25)) == noise.update(
        [GradientSample(2, 1.5)], GradientSample(4, 1.25))


def test_hooks_measure_each_micro_batch_gradient():
    """Real autograd through a small MLP: the hooks' per-micro-batch norms equal ``autograd.grad`` of each part."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    x, y = torch.randn(12, 6, dtype=torch.float64), torch.randn(12, dtype=torch.float64)
    norms = MicroBatchGradNorms(model)
    sizes = [3, 5, 4]
    bounds = [0, 3, 8, 12]
    for start, end in zip(bounds[:-1], bounds[1:]):
        norms.begin_micro_batch(end - start, scale=1.0)
        (0.5 * (model(x[start:end]).squeeze(-1) - y[start:end]) ** 2).mean().backward()
    samples = norms.finish()
    assert [sample.batch_size for sample in samples] == sizes
    for sample, start, end in zip(samples, bounds[:-1], bounds[1:]):
        loss = (0.5 * (model(x[start:end]).squeeze(-1) - y[start:end]) ** 2).mean()
        expected = sum(float(g.pow(2).sum()) for g in torch.autograd.grad(loss, list(model.parameters())))
        assert sample.sq_norm == pytest.approx(expected, rel=1e-12)
    norms.remove()
    model(x).sum().backward()
    assert norms.finish() == []


def test_monitor_hook_inside_the_real_accumulation_loop():
    """Through ``TrainingEngine.accumulate_gradients`` on a tiny HF model with activation checkpointing (hooks must survive the
    recompute): each sample is the micro-batch's own mean gradient, and the summary reproduces the big batch."""
    spec = TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=96)
    model = build_tiny_model(spec, 40, pad_token_id=0, eos_token_id=1).double().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, 40, (6, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -2:] = 0  # ragged responses: micro-batches carry different token counts
    attention_mask[4, -3:] = 0
    data = Batch(tensors=dict(input_ids=input_ids, attention_mask=attention_mask,
                              response_mask=attention_mask[:, -4:].clone()))

    class TokenNLL:
        agg_mode = "token-mean"

        def __call__(self, model, micro_batch, normalizer):
            log_probs, _ = response_log_probs(model, micro_batch["input_ids"], micro_batch["attention_mask"], 4)
            return -(log_probs * micro_batch["response_mask"]).sum() / normalizer, {}

    loss_fn = TokenNLL()
    monitor = NoiseScaleMonitor(model, DataParallelGroup())
    engine = TrainingEngine(model, dp=DataParallelGroup(), micro_batching=MicroBatching(micro_batch_size=2))
    engine.accumulate_gradients(data, loss_fn, hooks=[monitor])
    norms = monitor.norms
    samples = norms.finish()
    big_sq = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
    assert norms.global_batch_size == float(data["response_mask"].sum()) == 19
    assert [sample.batch_size for sample in samples] == [6, 8, 5]
    for sample, rows in zip(samples, (slice(0, 2), slice(2, 4), slice(4, 6))):
        model.zero_grad()
        part = data.index(list(range(6))[rows])
        loss, _ = loss_fn(model, part, part["response_mask"].sum())  # the micro-batch's own token mean
        loss.backward()
        expected = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
        # HF's RMSNorm computes in fp32 even in a float64 model, so the two scalings round differently at ~1e-9
        assert sample.sq_norm == pytest.approx(expected, rel=1e-7)
    summary = summarize(samples)
    assert summary.count == 3 and summary.sum_inverse_batch == pytest.approx(1 / 6 + 1 / 8 + 1 / 5)
    gradient_sq, trace = unbiased_estimates(summary, GradientSample(19, big_sq))
    assert math.isfinite(gradient_sq) and math.isfinite(trace)


# ------------------------------------------------------------------------------------------------ adaptive rule
def estimate(b_simple, updates=20):
    return NoiseScaleEstimate(gradient_sq=1.0, trace=b_simple, b_simple=b_simple, raw_gradient_sq=1.0,
                              raw_trace=b_simple, num_updates=updates)


RULE = AdaptiveAccumulation(min_steps=1, max_steps=16, reference_steps=4, lr_scaling="sqrt", tolerance=2.0,
                            min_updates=10)


def test_waits_for_enough_updates():
    decision = RULE.decide(4, batch_size=256, estimate=estimate(10_000, updates=9))
    assert not decision.changed and decision.grad_accum_steps == 4 and "waiting" in decision.reason
    assert RULE.decide(4, batch_size=256, estimate=None).grad_accum_steps == 4


def test_keeps_steps_within_tolerance():
    for b_simple in (128, 256, 512):  # mini-batch 256, tolerance ×2 on either side
        decision = RULE.decide(4, batch_size=256, estimate=estimate(b_simple))
        assert not decision.changed and decision.lr_multiplier == 1.0


def test_raises_steps_towards_b_simple_with_sqrt_lr():
    decision = RULE.decide(4, batch_size=256, estimate=estimate(2048))  # 64 per step → 32 steps wanted → 16 max
    assert decision.changed and decision.grad_accum_steps == 16
    assert decision.batch_size == 1024 and decision.lr_multiplier == pytest.approx(2.0)  # sqrt(16 / 4)
    decision = RULE.decide(4, batch_size=256, estimate=estimate(1100))  # 17.2 steps wanted → nearest power: 16
    assert decision.grad_accum_steps == 16
    decision = RULE.decide(4, batch_size=256, estimate=estimate(600))  # 9.4 steps wanted → 8
    assert decision.grad_accum_steps == 8 and "4 -> 8" in decision.reason


def test_lowers_steps_and_respects_bounds():
    decision = RULE.decide(8, batch_size=512, estimate=estimate(70))  # 64 per step → 1.1 steps → 1
    assert decision.grad_accum_steps == 1 and decision.lr_multiplier == pytest.approx(0.5)
    at_floor = RULE.decide(1, batch_size=64, estimate=estimate(5))
    assert not at_floor.changed and "bound" in at_floor.reason
    all_noise = RULE.decide(2, batch_size=128, estimate=estimate(math.inf))
    assert all_noise.grad_accum_steps == 16


@pytest.mark.parametrize("scaling,expected", [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_learning_rate_rules(scaling, expected):
    rule = AdaptiveAccumulation(min_steps=2, max_steps=8, reference_steps=2, lr_scaling=scaling, min_updates=0)
    assert rule.allowed_steps() == [2, 4, 8]
    assert rule.decide(2, batch_size=64, estimate=estimate(1e6)).lr_multiplier == pytest.approx(expected)


def test_explicit_choices_and_validation():
    rule = AdaptiveAccumulation(min_steps=1, max_steps=12, reference_steps=1, choices=(1, 3, 12), min_updates=0)
    assert rule.decide(1, batch_size=10, estimate=estimate(40)).grad_accum_steps == 3
    with pytest.raises(ValueError, match="min_steps"):
        AdaptiveAccumulation(min_steps=4, max_steps=2, reference_steps=1)
    with pytest.raises(ValueError, match="lr_scaling"):
        AdaptiveAccumulation(min_steps=1, max_steps=2, reference_steps=1, lr_scaling="cubic")
    with pytest.raises(ValueError, match="choices"):
        AdaptiveAccumulation(min_steps=1, max_steps=2, reference_steps=1, choices=(4,))
