"""Loss aggregation with an explicit, global normaliser — the gradient-accumulation invariant lives here.

A mini-batch (one optimizer step) is split over DP ranks and then into micro-batches. Each micro-batch calls
:func:`aggregate_loss` with ``normalizer`` = the count for the *whole mini-batch* (all micro-batches, all ranks),
obtained by summing :func:`loss_normalizer` over the mini-batch (an all-reduce across ranks). Then

    sum over micro-batches i of aggregate_loss(loss_i, mask_i, mode, normalizer=global)
        == aggregate_loss(concat(loss_i), concat(mask_i), mode)

for every mode, in value and in gradient: each micro-batch returns its *additive contribution* to the big-batch
loss. (A data-parallel wrapper that *averages* gradients over ranks, like FSDP, divides that sum by the world
size; the worker multiplies its loss by the world size to cancel it. That scaling lives in the worker, not here.)

Modes (``L`` = per-token loss, ``m`` = mask, ``n_i = sum_t m_it`` = tokens in row i, ``S`` = rows with n_i > 0):

- ``token-mean``:              ``sum_it m L / N``               with ``N = sum_i n_i`` (tokens)
- ``seq-mean-token-sum``:      ``sum_i (sum_t m L) / S``
- ``seq-mean-token-mean``:     ``sum_i (sum_t m L / n_i) / S``
- ``seq-mean-token-sum-norm``: ``sum_i (sum_t m L / H) / S``    with a constant horizon ``H`` (Dr. GRPO)

``H`` is ``loss_scale_factor``; when None it is ``response_mask.shape[-1]`` (the padded response length), which is
what verl does. Under micro-batching with per-micro-batch padding that width varies, so trainers should pass a
constant (``data.max_response_length``) to keep the invariant.

Fully masked rows count in no normaliser (their loss is 0 and they are not sequences); with ``normalizer=None``
this matches verl's ``agg_loss`` whenever no row is fully masked (verl versions disagree on such rows).

``seq-mean-token-sum-norm`` here is the Dr. GRPO form, a mean over sequences of ``token-sum / H``. Some verl versions
compute ``sum over sequences of token-sum / H`` instead (no mean over sequences): that loss, and its gradient, is
larger by the number of sequences, which matters with gradient clipping — port learning rates with care.
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.masked import masked_count, masked_sum

__all__ = ["LOSS_AGG_MODES", "aggregate_loss", "loss_normalizer"]

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

Normalizer = int | float | torch.Tensor


def _check_mode(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")


def loss_normalizer(response_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The count this batch contributes to the global normaliser of ``mode`` (a 0-dim int64 tensor).

    Valid tokens for ``token-mean``; sequences with at least one valid token for the ``seq-mean-*`` modes.
    Sum it over micro-batches and all-reduce it over DP ranks to get the mini-batch ``normalizer``.
    ``response_mask`` is ``[batch, response_len]``.
    """
    _check_mode(mode)
    if mode == "token-mean":
        return masked_count(response_mask)
    return (masked_count(response_mask, dim=-1) > 0).sum()


def _denominator(normalizer: Normalizer, like: torch.Tensor) -> torch.Tensor:
    """The normaliser as a tensor of ``like``'s dtype, floored at 1 (an empty mini-batch gives loss 0, not NaN)."""
    if not isinstance(normalizer, torch.Tensor):
        if normalizer < 0:
            raise ValueError(f"normalizer must be a non-negative count, got {normalizer}")
        normalizer = torch.tensor(normalizer)
    return normalizer.to(device=like.device, dtype=like.dtype).clamp_min(1)


def aggregate_loss(
    loss_mat: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    normalizer: Normalizer | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss ``[batch, response_len]`` to a scalar, as described in the module docstring.

    Args:
        loss_mat: per-token losses, ``[batch, response_len]``; values at masked positions are ignored (even NaN).
        response_mask: 0/1 mask of valid response tokens, same shape.
        mode: one of :data:`LOSS_AGG_MODES`.
        normalizer: the mini-batch-global count (tokens for ``token-mean``, sequences otherwise), a Python number
            or a 0-dim tensor (e.g. straight out of an all-reduce). None: this batch alone,
            ``loss_normalizer(response_mask, mode)``.
        loss_scale_factor: the constant horizon ``H`` of ``seq-mean-token-sum-norm`` (ignored by other modes);
            None: ``response_mask.shape[-1]``.

    Returns:
        A 0-dim tensor: this batch's additive contribution to the mini-batch loss.
    """
    _check_mode(mode)
    if loss_mat.shape != response_mask.shape or loss_mat.dim() != 2:
        raise ValueError(
            f"loss_mat {tuple(loss_mat.shape)} and response_mask {tuple(response_mask.shape)} must both be "
            "[batch, response_len]"
        )
    if normalizer is None:
        normalizer = loss_normalizer(response_mask, mode)
    denominator = _denominator(normalizer, loss_mat)
    if mode == "token-mean":
        return masked_sum(loss_mat, response_mask) / denominator
    per_sequence = masked_sum(loss_mat, response_mask, dim=-1)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / masked_count(response_mask, dim=-1).clamp_min(1).to(loss_mat.dtype)
    elif mode == "seq-mean-token-sum-norm":
        horizon = response_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        if horizon <= 0:
            raise ValueError(f"loss_scale_factor must be positive, got {horizon}")
        per_sequence = per_sequence / horizon
    return per_sequence.sum() / denominator
