"""Clipped value loss: hand cases for both branches, a loop reference, and gradients."""

from __future__ import annotations

import pytest
import torch

from hybridrl.algorithms import LOSS_AGG_MODES, aggregate_loss, loss_normalizer, value_loss


def test_value_clipping_by_hand():
    values = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    vpreds = torch.tensor([[2.0, 1.2, 2.0, 9.0]], requires_grad=True)
    returns = torch.tensor([[3.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(vpreds, values, returns, mask, cliprange_value=0.5, loss_agg_mode="token-mean")
    # token 0: (2-3)^2 = 1 vs clipped (1.5-3)^2 = 2.25 -> 2.25, clipped; token 1: inside the range, 1.44;
    # token 2: (2-0)^2 = 4 vs (1.5-0)^2 = 2.25 -> 4, not clipped; token 3 is padding.
    assert loss.item() == pytest.approx(0.5 * (2.25 + 1.44 + 4.0) / 3)
    assert metrics["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert metrics["vf_loss"].item() == loss.item()
    loss.backward()
    # the clipped branch is constant in vpreds (it sits on the clip boundary): no gradient there
    assert torch.allclose(vpreds.grad, torch.tensor([[0.0, 1.2, 2.0, 0.0]]) / 3)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_value_loss_matches_loop(mode, seed, ragged_mask):
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask(6, 5, g)
    values, returns = torch.randn(6, 5, generator=g), torch.randn(6, 5, generator=g)
    vpreds = values + torch.randn(6, 5, generator=g) * 0.5
    clip = 0.2
    per_token = torch.zeros(6, 5)
    for i in range(6):
        for t in range(5):
            v, old, target = vpreds[i, t].item(), values[i, t].item(), returns[i, t].item()
            clipped = min(max(v, old - clip), old + clip)
            per_token[i, t] = max((v - target) ** 2, (clipped - target) ** 2)
    loss, metrics = value_loss(vpreds, values, returns, mask, cliprange_value=clip, loss_agg_mode=mode)
    assert loss.item() == pytest.approx(0.5 * aggregate_loss(per_token, mask, mode).item(), abs=1e-5)
    assert 0.0 < metrics["vf_clipfrac"].item() < 1.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_value_loss_accumulates_over_micro_batches(mode, ragged_mask):
    g = torch.Generator().manual_seed(3)
    mask = ragged_mask(7, 4, g)
    values = torch.randn(7, 4, generator=g, dtype=torch.float64)
    returns = torch.randn(7, 4, generator=g, dtype=torch.float64)
    vpreds = (values + torch.randn(7, 4, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    whole, _ = value_loss(vpreds, values, returns, mask, 0.2, mode)
    (whole_grad,) = torch.autograd.grad(whole, vpreds)
    normalizer = loss_normalizer(mask, mode)
    pieces = [slice(0, 2), slice(2, 3), slice(3, 7)]
    total = sum(
        value_loss(vpreds[p], values[p], returns[p], mask[p], 0.2, mode, normalizer=normalizer)[0] for p in pieces
    )
    (split_grad,) = torch.autograd.grad(total, vpreds)
    assert total.item() == pytest.approx(whole.item(), abs=1e-12)
    assert torch.allclose(split_grad, whole_grad, atol=1e-12)
