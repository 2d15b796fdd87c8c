"""The HF engine's sampler against slow references: top-k / top-p filtering row by row in plain Python, and the
inverse-CDF draw against the distribution it samples (frequencies over many draws)."""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.rollout.sampling import filter_top_k_top_p, next_tokens, sample_rows


def reference_kept(row: list[float], top_k: int, top_p: float) -> set[int]:
    """The token ids a row keeps: the ``top_k`` largest logits, then the most probable tokens while the mass of
    those ranked above is below ``top_p`` (computed over the top-k survivors, renormalised)."""
    order = sorted(range(len(row)), key=lambda i: -row[i])
    if 0 < top_k < len(row):
        order = order[:top_k]
    largest = max(row[i] for i in order)
    weights = {i: math.exp(row[i] - largest) for i in order}
    total = sum(weights.values())
    kept, mass_above = set(), 0.0
    for i in order:
        if mass_above >= top_p and top_p < 1.0:
            break
        kept.add(i)
        mass_above += weights[i] / total
    return kept


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.9), (7, 0.5), (3, 0.999), (0, 1e-6), (40, 0.3)])
def test_filter_keeps_what_the_reference_keeps(top_k, top_p):
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(top_k + int(top_p * 1000)), dtype=torch.float64)
    logits = logits * 3
    filtered = filter_top_k_top_p(logits, top_k, top_p)
    for row, out in zip(logits.tolist(), filtered):
        kept = {i for i, value in enumerate(out.tolist()) if value != float("-inf")}
        assert kept == reference_kept(row, top_k, top_p)
        assert all(out[i] == row[i] for i in kept)  # survivors keep their logits


def test_sample_frequencies_match_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    draws = 200_000
    counts = torch.bincount(sample_rows(probs.expand(draws, -1).contiguous()), minlength=6).double()
    assert counts[1] == 0 and counts[5] == 0  # probability 0, inside and at the end of the vocabulary
    expected = probs.double() * draws
    nonzero = probs > 0
    sigma = (expected * (1 - probs.double())).sqrt()
    assert ((counts - expected).abs()[nonzero] < 5 * sigma[nonzero]).all(), counts.tolist()


def test_rows_that_do_not_sum_to_one_never_draw_a_removed_token():
    """The draw scales its uniform number by the row's own total, so a row a little short of (or over) 1 and a row
    with all its mass on one token behave; the trailing zero-probability tokens are never drawn."""
    torch.manual_seed(1)
    rows = torch.tensor([[0.3, 0.3, 0.3999, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2000001]])
    tokens = sample_rows(rows.repeat(20_000, 1))
    assert tokens.view(-1, 3)[:, 0].max() <= 2 and (tokens.view(-1, 3)[:, 1] == 2).all()
    assert set(tokens.view(-1, 3)[:, 2].tolist()) == {0, 1, 2, 3, 4}


def test_next_tokens_greedy_is_argmax_and_sampling_is_seeded():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(2))
    assert torch.equal(next_tokens(logits, do_sample=False, top_k=0, top_p=1.0), logits.argmax(-1))
    torch.manual_seed(3)
    first = next_tokens(logits, do_sample=True, top_k=10, top_p=0.8)
    torch.manual_seed(3)
    assert torch.equal(next_tokens(logits, do_sample=True, top_k=10, top_p=0.8), first)
    kept = filter_top_k_top_p(logits, 10, 0.8) != float("-inf")
    assert kept.gather(-1, first.unsqueeze(-1)).all()
