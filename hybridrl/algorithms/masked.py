"""Masked reductions over response tokens.

A *mask* here is a 0/1 tensor (bool, integer or float) broadcastable to the values, 1 on valid response tokens.
Masked positions are excluded with ``torch.where`` rather than multiplied by zero, so a NaN or inf sitting in
padding can never leak into a result or its gradient.
"""

from __future__ import annotations

import torch

__all__ = ["masked_sum", "masked_count", "masked_mean", "masked_var", "masked_whiten"]

# Added to the variance before the inverse square root, as verl does, so constant inputs whiten to zeros.
WHITEN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over valid positions; over everything (0-dim result) when ``dim`` is None."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of valid positions (int64), in total or along ``dim``."""
    valid = mask.bool()
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over valid positions; 0 where there are none (never NaN).

    Equals verl's ``masked_mean`` (which divides by ``count + 1e-8``) up to that epsilon.
    """
    count = masked_count(mask, dim).clamp_min(1).to(values.dtype)
    return masked_sum(values, mask, dim) / count


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all valid positions (a 0-dim tensor).

    With ``unbiased`` the Bessel correction ``n / (n - 1)`` is applied. Fewer than two valid elements give
    variance 0 (verl raises instead; a one-token batch is legal, if useless, so we do not).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = masked_count(mask).to(values.dtype)
        variance = torch.where(count > 1, variance * count / (count - 1).clamp_min(1), torch.zeros_like(variance))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise ``values`` to zero mean and unit (unbiased) variance over the valid positions.

    ``(x - mean) / sqrt(var + 1e-8)`` with mean and variance taken over valid positions of the whole tensor, as
    verl's ``masked_whiten``; with ``shift_mean=False`` the mean is added back. Unlike verl, masked positions are
    set to 0 in the output so the result can be used directly as per-token advantages.

    Shapes: ``values`` and ``mask`` are ``[batch, response_len]`` (any matching shape works); same-shape output.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))
