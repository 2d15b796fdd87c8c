"""scores_to_token_level: the score lands on each row's last valid response token."""

from __future__ import annotations

import pytest
import torch

from hybridrl.rewards import scores_to_token_level


def _reference(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Slow, obvious loop."""
    out = torch.zeros(mask.shape, dtype=torch.float32)
    for row in range(mask.shape[0]):
        valid = [position for position in range(mask.shape[1]) if mask[row, position]]
        if valid:
            out[row, valid[-1]] = float(scores[row])
    return out


def test_hand_case():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    scores = torch.tensor([0.5, -1.0, 3.0, 2.0])
    expected = torch.tensor([[0, 0.5, 0, 0], [0, 0, 0, -1.0], [0, 0, 0, 0], [0, 0, 2.0, 0]])
    assert torch.equal(scores_to_token_level(scores, mask), expected)


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_loop_on_random_masks(seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(9, 13, generator=generator) > 0.4
    scores = torch.randn(9, generator=generator)
    result = scores_to_token_level(scores, mask)
    assert torch.equal(result, _reference(scores, mask))
    assert torch.allclose(result.sum(dim=1), torch.where(mask.any(dim=1), scores, torch.zeros(9)))


def test_integer_scores_become_float_and_dtype_is_kept():
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert scores_to_token_level(torch.tensor([1, 0]), mask).dtype == torch.float32
    assert scores_to_token_level(torch.tensor([1.0, 0.0], dtype=torch.float64), mask).dtype == torch.float64
    assert scores_to_token_level(torch.tensor([1.0]), torch.ones(1, 0)).shape == (1, 0)


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError, match=r"scores must be \[B\] and response_mask \[B, R\].*\(3,\) and \(2, 4\)"):
        scores_to_token_level(torch.zeros(3), torch.ones(2, 4))
