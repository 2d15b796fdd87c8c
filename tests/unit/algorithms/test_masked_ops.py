"""Masked reductions against explicit selections of the valid elements."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.algorithms.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_mean_and_sum_match_selection(seed, ragged_mask):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(5, 7, generator=g)
    mask = ragged_mask(5, 7, g, holes=True)
    chosen = values[mask.bool()]
    assert torch.allclose(masked_sum(values, mask), chosen.sum())
    assert torch.allclose(masked_mean(values, mask), chosen.mean())
    assert int(masked_count(mask)) == chosen.numel()
    for row in range(5):
        row_chosen = values[row][mask[row].bool()]
        expected = row_chosen.mean() if row_chosen.numel() else torch.tensor(0.0)
        assert torch.allclose(masked_mean(values, mask, dim=-1)[row], expected)


def test_masked_positions_never_leak_nan_or_inf():
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]])
    mean = masked_mean(values, mask)
    assert mean.item() == 2.0
    mean.backward()
    assert torch.equal(values.grad, torch.tensor([[0.5, 0.0], [0.0, 0.5]]))


def test_empty_mask_gives_zero_not_nan():
    values = torch.randn(2, 3)
    mask = torch.zeros(2, 3)
    assert masked_mean(values, mask).item() == 0.0
    assert masked_var(values, mask).item() == 0.0
    assert torch.equal(masked_whiten(values, mask), torch.zeros(2, 3))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_var_is_unbiased_variance_of_selection(seed, ragged_mask):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(6, 5, generator=g) * 3 + 1
    mask = ragged_mask(6, 5, g)
    chosen = values[mask.bool()]
    assert torch.allclose(masked_var(values, mask), chosen.var(unbiased=True), atol=1e-5)
    assert torch.allclose(masked_var(values, mask, unbiased=False), chosen.var(unbiased=False), atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_whiten_normalises_valid_entries_and_zeroes_the_rest(seed, ragged_mask):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(6, 5, generator=g) * 4 - 2
    mask = ragged_mask(6, 5, g, holes=True)
    whitened = masked_whiten(values, mask)
    chosen = values[mask.bool()]
    expected = (chosen - chosen.mean()) / torch.sqrt(chosen.var(unbiased=True) + 1e-8)
    assert torch.allclose(whitened[mask.bool()], expected, atol=1e-5)
    assert torch.all(whitened[~mask.bool()] == 0)
    assert abs(whitened[mask.bool()].mean().item()) < 1e-5
    assert math.isclose(whitened[mask.bool()].std().item(), 1.0, rel_tol=1e-4)
    unshifted = masked_whiten(values, mask, shift_mean=False)
    assert torch.allclose(unshifted[mask.bool()], expected + chosen.mean(), atol=1e-5)


def test_whiten_of_a_single_valid_element_is_zero():
    values = torch.tensor([[5.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0]])
    assert torch.equal(masked_whiten(values, mask), torch.zeros(1, 2))
