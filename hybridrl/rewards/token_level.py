"""Placing one scalar score per sequence onto the response tokens (an outcome reward, as PPO/GRPO expect it)."""

from __future__ import annotations

import torch

__all__ = ["scores_to_token_level"]


def scores_to_token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-level rewards ``[B, R]``: each row's score on its last valid response token, 0 elsewhere.

    Args:
        scores: ``[B]`` one score per sequence.
        response_mask: ``[B, R]`` 1 (or True) on real response tokens, 0 on padding. The *last* 1 of a row gets
            the score, so masks with holes (multi-turn observations) work too.

    Returns:
        ``[B, R]`` tensor of ``scores``' dtype (float32 if ``scores`` is not floating point) on ``scores``' device.
        A row with no valid response token stays all zero: its score has nowhere to go (and a token-mean loss
        gives that row no weight anyway).
    """
    if scores.ndim != 1 or response_mask.ndim != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"scores must be [B] and response_mask [B, R] with the same B, got {tuple(scores.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    mask = response_mask.to(device=scores.device).bool()
    length = mask.shape[1]
    token_level = torch.zeros(mask.shape, dtype=dtype, device=scores.device)
    if length == 0:
        return token_level
    has_tokens = mask.any(dim=1)
    # argmax returns the first maximum: on the flipped mask that is the last valid position.
    last_index = length - 1 - mask.flip(dims=[1]).to(torch.int8).argmax(dim=1)
    rows = torch.nonzero(has_tokens, as_tuple=True)[0]
    token_level[rows, last_index[rows]] = scores[rows].to(dtype)
    return token_level
