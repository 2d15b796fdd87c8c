"""The Bradley–Terry loss against a slow per-pair loop, and its accumulation invariant (micro-batch shares add up)."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.algorithms.preference import bradley_terry_loss


def slow_loss(chosen, rejected, margin, center_coef):
    """Mean over pairs of −log σ(r_c − r_r − m) + λ (r_c + r_r)², one pair at a time in Python floats."""
    total = 0.0
    for c, r, m in zip(chosen.tolist(), rejected.tolist(), margin.tolist()):
        total += -math.log(1.0 / (1.0 + math.exp(-(c - r - m)))) + center_coef * (c + r) ** 2
    return total / len(chosen)


@pytest.mark.parametrize("center_coef", [0.0, 0.05])
@pytest.mark.parametrize("with_margin", [False, True])
def test_matches_the_per_pair_loop(center_coef, with_margin):
    generator = torch.Generator().manual_seed(0)
    chosen, rejected, margin = (torch.randn(9, generator=generator, dtype=torch.float64) for _ in range(3))
    chosen = chosen * 3
    margin = margin.abs() if with_margin else torch.zeros(9, dtype=torch.float64)
    loss, metrics = bradley_terry_loss(chosen, rejected, normalizer=9, margin=margin if with_margin else None,
                                       center_coef=center_coef)
    assert float(loss) == pytest.approx(slow_loss(chosen, rejected, margin, center_coef), rel=1e-12)
    assert float(metrics["loss"]) == float(loss)
    assert float(metrics["accuracy"]) == pytest.approx(sum(c > r for c, r in zip(chosen, rejected)) / 9)
    assert float(metrics["margin"]) == pytest.approx(float((chosen - rejected).mean()))


def test_gradient_matches_the_closed_form():
    chosen, rejected = torch.tensor([1.0, -2.0], requires_grad=True), torch.tensor([0.5, 1.0], requires_grad=True)
    loss, _ = bradley_terry_loss(chosen, rejected, normalizer=2)
    loss.backward()
    expected = -torch.sigmoid(-(chosen - rejected).detach()) / 2  # d/dx softplus(-x) = -σ(-x)
    assert torch.allclose(chosen.grad, expected) and torch.allclose(rejected.grad, -expected)


def test_micro_batch_shares_with_the_global_normalizer_add_up_to_the_big_batch():
    generator = torch.Generator().manual_seed(1)
    chosen, rejected, margin = (torch.randn(10, generator=generator) for _ in range(3))
    whole, _ = bradley_terry_loss(chosen, rejected, normalizer=10, margin=margin, center_coef=0.1)
    parts = sum(bradley_terry_loss(chosen[cut], rejected[cut], normalizer=10, margin=margin[cut], center_coef=0.1)[0]
                for cut in (slice(0, 3), slice(3, 4), slice(4, 10)))
    assert float(parts) == pytest.approx(float(whole), rel=1e-6)


def test_margin_and_centring_push_the_right_way():
    chosen, rejected = torch.tensor([1.0]), torch.tensor([0.0])
    plain = float(bradley_terry_loss(chosen, rejected, normalizer=1)[0])
    assert float(bradley_terry_loss(chosen, rejected, normalizer=1, margin=torch.tensor([2.0]))[0]) > plain
    assert float(bradley_terry_loss(chosen + 5, rejected + 5, normalizer=1, center_coef=0.1)[0]) > plain
    assert float(bradley_terry_loss(chosen + 5, rejected + 5, normalizer=1)[0]) == pytest.approx(plain)


def test_bad_shapes_and_coefficients_are_refused():
    with pytest.raises(ValueError, match=r"must both be \[batch\]"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(4), normalizer=3)
    with pytest.raises(ValueError, match=r"must both be \[batch\]"):
        bradley_terry_loss(torch.zeros(3, 1), torch.zeros(3, 1), normalizer=3)
    with pytest.raises(ValueError, match="center_coef"):
        bradley_terry_loss(torch.zeros(3), torch.zeros(3), normalizer=3, center_coef=-1)
