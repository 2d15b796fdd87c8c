"""Off-policy corrections (``algorithms/off_policy.py``) against slow references written token by token."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.algorithms.off_policy import (decoupled_ppo_token_loss, masked_importance,
                                            truncated_importance_weights)


def data(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    shape = (5, 7)
    behaviour = -torch.rand(shape, generator=generator) * 3
    proximal = behaviour + torch.randn(shape, generator=generator) * 0.7
    current = proximal + torch.randn(shape, generator=generator) * 0.3
    advantages = torch.randn(shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    for row, length in enumerate([7, 3, 0, 5, 1]):
        mask[row, length:] = 0
    return current, proximal, behaviour, advantages, mask


def sequence_ratio(proximal, behaviour, mask, row):
    return math.exp(sum(float(proximal[row, t] - behaviour[row, t]) for t in range(mask.shape[1]) if mask[row, t]))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_truncated_importance_weights_match_the_reference(level):
    _, proximal, behaviour, _, mask = data()
    cap = 1.5 if level == "token" else 20.0
    result = truncated_importance_weights(proximal, behaviour, mask, cap, level)
    corrected = total = 0
    for row in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[row, t]:
                assert result.weights[row, t] == 0
                continue
            ratio = math.exp(float(proximal[row, t] - behaviour[row, t])) if level == "token" else \
                sequence_ratio(proximal, behaviour, mask, row)
            assert float(result.weights[row, t]) == pytest.approx(min(ratio, cap), rel=1e-5)
            corrected, total = corrected + (ratio > cap), total + 1
    assert torch.equal(result.mask, mask)
    assert float(result.stats["fraction_corrected"]) == pytest.approx(corrected / total)
    assert 0 < corrected < total  # the data exercises both sides of the cap


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_importance_drops_what_leaves_the_band(level):
    _, proximal, behaviour, _, mask = data(1)
    low, high = 0.5, 2.0
    result = masked_importance(proximal, behaviour, mask, low, high, level)
    kept = 0
    for row in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            ratio = math.exp(float(proximal[row, t] - behaviour[row, t])) if level == "token" else \
                sequence_ratio(proximal, behaviour, mask, row)
            expected = int(bool(mask[row, t]) and low <= ratio <= high)
            assert int(result.mask[row, t]) == expected and float(result.weights[row, t]) == expected
            kept += expected
    assert 0 < kept < int(mask.sum())
    if level == "sequence":  # a sequence is kept or dropped whole
        for row in range(mask.shape[0]):
            assert len({int(v) for v, m in zip(result.mask[row], mask[row]) if m}) <= 1


def test_decoupled_ppo_is_ppo_weighted_by_the_behaviour_ratio():
    current, proximal, behaviour, advantages, mask = data(2)
    current.requires_grad_(True)
    loss = decoupled_ppo_token_loss(current, proximal, behaviour, advantages, mask, 0.2, 0.28, behaviour_cap=2.0)
    for row in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if not mask[row, t]:
                assert loss[row, t] == 0
                continue
            r = math.exp(float(current[row, t] - proximal[row, t]))
            a = float(advantages[row, t])
            surrogate = max(-a * r, -a * min(max(r, 0.8), 1.28))
            w = min(math.exp(float(proximal[row, t] - behaviour[row, t])), 2.0)
            assert float(loss[row, t]) == pytest.approx(w * surrogate, rel=1e-5, abs=1e-7)
    loss.sum().backward()  # the weight is detached: gradients flow through π_θ only
    assert current.grad is not None and proximal.grad is None


def test_decoupled_ppo_without_behaviour_lag_is_plain_ppo():
    current, proximal, _, advantages, mask = data(3)
    plain = decoupled_ppo_token_loss(current, proximal, proximal, advantages, mask, 0.2, 0.2)
    ratio = torch.exp(current - proximal)
    reference = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)) * mask
    assert torch.allclose(plain, reference)


def test_bad_parameters_are_refused():
    _, proximal, behaviour, _, mask = data()
    with pytest.raises(ValueError, match="cap > 0"):
        truncated_importance_weights(proximal, behaviour, mask, 0.0)
    with pytest.raises(ValueError, match="0 <= low <= 1 <= high"):
        masked_importance(proximal, behaviour, mask, 1.2, 2.0)
    with pytest.raises(ValueError, match="level must be one of"):
        truncated_importance_weights(proximal, behaviour, mask, 2.0, "batch")
