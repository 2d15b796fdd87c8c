"""Loss aggregation: each mode against a loop reference, and THE invariant — micro-batches aggregated with the
global normaliser sum to the whole-batch loss, in value and in gradient."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridrl.algorithms import LOSS_AGG_MODES, aggregate_loss, loss_normalizer

FAST = settings(max_examples=30, deadline=None)


def aggregate_reference(loss_mat, mask, mode, horizon=None):
    """verl's agg_loss, written as loops over rows and tokens (fully masked rows are not sequences)."""
    horizon = mask.shape[1] if horizon is None else horizon
    rows = []
    for i in range(loss_mat.shape[0]):
        tokens = [loss_mat[i, t].item() for t in range(loss_mat.shape[1]) if mask[i, t]]
        if tokens:
            rows.append(tokens)
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    per_row = {
        "seq-mean-token-sum": [sum(r) for r in rows],
        "seq-mean-token-mean": [sum(r) / len(r) for r in rows],
        "seq-mean-token-sum-norm": [sum(r) / horizon for r in rows],
    }[mode]
    return sum(per_row) / len(per_row)


def test_hand_computed_modes():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    expected = {
        "token-mean": 15 / 5,
        "seq-mean-token-sum": (6 + 9) / 2,
        "seq-mean-token-mean": (2 + 4.5) / 2,
        "seq-mean-token-sum-norm": (6 / 3 + 9 / 3) / 2,
    }
    for mode, value in expected.items():
        assert aggregate_loss(loss_mat, mask, mode).item() == pytest.approx(value), mode
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.75)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("seed,batch,length", [(0, 6, 5), (1, 3, 1), (2, 9, 8), (3, 1, 4)])
def test_modes_match_loop_reference(mode, seed, batch, length, ragged_mask):
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask(batch, length, g, holes=seed % 2 == 1)
    loss_mat = torch.randn(batch, length, generator=g)
    expected = aggregate_reference(loss_mat, mask, mode)
    assert aggregate_loss(loss_mat, mask, mode).item() == pytest.approx(expected, abs=1e-5)


def test_normalizer_counts_tokens_or_non_empty_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert loss_normalizer(mask, "token-mean").item() == 3
    for mode in LOSS_AGG_MODES[1:]:
        assert loss_normalizer(mask, mode).item() == 2
    assert loss_normalizer(mask, "token-mean").dtype == torch.int64  # exact under all-reduce


def test_normalizer_accepts_python_numbers_and_tensors():
    loss_mat, mask = torch.ones(2, 3), torch.ones(2, 3)
    for normalizer in (12, 12.0, torch.tensor(12), torch.tensor(12.0)):
        assert aggregate_loss(loss_mat, mask, "token-mean", normalizer=normalizer).item() == pytest.approx(0.5)


def test_empty_batch_gives_zero_not_nan():
    for mode in LOSS_AGG_MODES:
        loss = aggregate_loss(torch.randn(2, 3), torch.zeros(2, 3), mode)
        assert loss.item() == 0.0, mode
        loss = aggregate_loss(torch.randn(2, 3), torch.zeros(2, 3), mode, normalizer=0)
        assert loss.item() == 0.0, mode


def test_masked_nan_does_not_reach_loss_or_gradient():
    theta = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss_mat = torch.where(torch.tensor([[True, False], [True, True]]), theta, torch.tensor(float("nan")))
    for mode in LOSS_AGG_MODES:
        theta.grad = None
        loss = aggregate_loss(loss_mat, torch.tensor([[1, 0], [1, 1]]), mode)
        loss.backward(retain_graph=True)
        assert torch.isfinite(loss) and torch.isfinite(theta.grad).all(), mode


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "token-sum")
    with pytest.raises(ValueError, match="response_mask"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 3), "token-mean")
    with pytest.raises(ValueError, match="non-negative"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "token-mean", normalizer=-1)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        aggregate_loss(torch.zeros(2, 2), torch.ones(2, 2), "seq-mean-token-sum-norm", loss_scale_factor=0)


# ----------------------------------------------------------------------------------------------- the invariant
@st.composite
def micro_batch_splits(draw):
    batch = draw(st.integers(1, 9))
    length = draw(st.integers(1, 6))
    cuts = sorted(draw(st.sets(st.integers(1, batch - 1), max_size=batch - 1))) if batch > 1 else []
    bounds = [0, *cuts, batch]
    pieces = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    return batch, length, pieces, draw(st.integers(0, 2**31 - 1)), draw(st.booleans())


def _losses_and_grads(theta, scale, mask, mode, pieces, horizon, global_normalizer=True):
    """Accumulate gradients over micro-batches (each a backward call), as a worker does."""
    theta.grad, scale.grad = None, None
    normalizer = sum(loss_normalizer(mask[p], mode) for p in pieces) if global_normalizer else None
    total = 0.0
    for piece in pieces:
        loss_mat = scale * (theta[piece] ** 2 + torch.sin(theta[piece]))  # scale: a parameter shared by all
        loss = aggregate_loss(loss_mat, mask[piece], mode, normalizer=normalizer, loss_scale_factor=horizon)
        loss.backward()
        total += loss.item()
    return total, theta.grad.clone(), scale.grad.clone()


@FAST
@given(split=micro_batch_splits(), mode=st.sampled_from(LOSS_AGG_MODES))
def test_micro_batches_with_global_normaliser_sum_to_whole_batch(split, mode, ragged_mask):
    batch, length, pieces, seed, holes = split
    g = torch.Generator().manual_seed(seed)
    mask = ragged_mask(batch, length, g, holes=holes)
    theta = torch.randn(batch, length, generator=g, dtype=torch.float64).requires_grad_()
    scale = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    horizon = None if seed % 2 else 7.0
    whole = _losses_and_grads(theta, scale, mask, mode, [slice(0, batch)], horizon, global_normalizer=False)
    split_result = _losses_and_grads(theta, scale, mask, mode, pieces, horizon)
    assert split_result[0] == pytest.approx(whole[0], abs=1e-9)
    assert torch.allclose(split_result[1], whole[1], atol=1e-12)
    assert torch.allclose(split_result[2], whole[2], atol=1e-9)
    loss_mat = scale.detach() * (theta.detach() ** 2 + torch.sin(theta.detach()))
    assert whole[0] == pytest.approx(aggregate_reference(loss_mat, mask, mode, horizon), abs=1e-9)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_per_micro_batch_normalisation_would_be_wrong(mode):
    """The bug the invariant guards against is detectable: normalising each micro-batch alone differs."""
    loss_mat = torch.tensor([[1.0, 1.0, 1.0], [5.0, 1.0, 0.0], [2.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0]])  # 3 tokens in the first micro-batch, 4 in the second
    whole = aggregate_loss(loss_mat, mask, mode)
    pieces = [slice(0, 1), slice(1, 3)]
    naive = sum(aggregate_loss(loss_mat[p], mask[p], mode) for p in pieces) / len(pieces)
    exact = sum(aggregate_loss(loss_mat[p], mask[p], mode, normalizer=loss_normalizer(mask, mode)) for p in pieces)
    assert exact.item() == pytest.approx(whole.item())
    assert naive.item() != pytest.approx(whole.item())
