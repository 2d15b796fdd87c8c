"""Off-policy corrections for samples the trainer's current weights did not generate (pure functions, ``[B, R]``).

The rollout engine's *behaviour* log-probs (``rollout_log_probs``: another engine's numerics, or older weights in
asynchronous training) differ from the trainer's *proximal* log-probs (``old_log_probs``, recomputed by the trainer
before the update). Three standard corrections, each returning a per-token weight or mask the policy loss multiplies
in, plus statistics of the ratio:

- **truncated importance sampling** (TIS): weight ``min(π_prox / π_behav, C)`` per token, or — ``level="sequence"``
  — one weight per response, ``min(exp(Σ_t log π_prox − log π_behav), C)``, on all its tokens;
- **masked importance sampling** (MIS): keep a token (or a whole sequence) only while its ratio lies in
  ``[low, high]``; the rest take no loss (and leave the normaliser: the returned mask replaces ``response_mask``);
- **decoupled PPO** (behaviour ≠ proximal): clip the ratio ``π_θ / π_prox`` as PPO does, and weight each token's
  clipped surrogate by ``π_prox / π_behav`` (optionally truncated) — :func:`decoupled_ppo_token_loss`.

Weights are detached: they correct the estimate, they are not optimised. Ratios are computed in log space and clamped
before ``exp`` (as the policy losses do), so a token the behaviour policy found very unlikely cannot overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridrl.algorithms.masked import masked_mean

LOG_RATIO_CLAMP = 20.0
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class Correction:
    """``weights`` ``[B, R]`` (0 outside the mask), ``mask`` ``[B, R]`` (the tokens that keep a loss) and the ratio's
    statistics as detached 0-dim tensors: ``ratio_mean``, ``ratio_max``, ``ratio_min`` (over valid tokens, or
    sequences at sequence level) and ``fraction_corrected`` (tokens whose weight or mask the correction changed)."""

    weights: torch.Tensor
    mask: torch.Tensor
    stats: dict[str, torch.Tensor]


def _log_ratio(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``log π_prox − log π_behav`` per token, or its per-sequence sum broadcast to the tokens (``[B, R]``)."""
    if level not in LEVELS:
        raise ValueError(f"importance-sampling level must be one of {LEVELS}, got {level!r}")
    per_token = torch.where(mask.bool(), proximal - behaviour, torch.zeros_like(proximal))
    if level == "token":
        return per_token.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return per_token.sum(-1, keepdim=True).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).expand_as(per_token)


def _stats(ratio: torch.Tensor, mask: torch.Tensor, changed: torch.Tensor, level: str) -> dict[str, torch.Tensor]:
    valid = mask.bool()
    if level == "sequence":  # one ratio per response (broadcast over its tokens): take it once per valid row
        values = ratio[:, 0][valid.any(-1)] if ratio.shape[-1] else ratio.new_zeros(0)
    else:
        values = ratio[valid]
    empty = values.numel() == 0
    return {"ratio_mean": (values.mean() if not empty else ratio.new_zeros(())).detach(),
            "ratio_max": (values.max() if not empty else ratio.new_zeros(())).detach(),
            "ratio_min": (values.min() if not empty else ratio.new_zeros(())).detach(),
            "fraction_corrected": masked_mean(changed.float(), mask).detach()}


def truncated_importance_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                                 response_mask: torch.Tensor, cap: float, level: str = "token") -> Correction:
    """TIS: ``weights = min(ratio, cap)`` (see the module docstring); the mask is unchanged. ``cap`` > 0."""
    if cap <= 0:
        raise ValueError(f"truncated importance sampling needs a cap > 0, got {cap}")
    with torch.no_grad():
        ratio = torch.exp(_log_ratio(proximal_log_probs, behaviour_log_probs, response_mask, level))
        weights = ratio.clamp(max=cap) * response_mask
        changed = (ratio > cap) & response_mask.bool()
        return Correction(weights, response_mask.clone(), _stats(ratio, response_mask, changed, level))


def masked_importance(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                      response_mask: torch.Tensor, low: float, high: float, level: str = "token") -> Correction:
    """MIS: tokens (or whole sequences) whose ratio leaves ``[low, high]`` are dropped from the loss; the others keep
    weight 1. ``0 <= low <= 1 <= high``."""
    if not 0 <= low <= 1 <= high:
        raise ValueError(f"masked importance sampling needs 0 <= low <= 1 <= high, got low={low}, high={high}")
    with torch.no_grad():
        ratio = torch.exp(_log_ratio(proximal_log_probs, behaviour_log_probs, response_mask, level))
        inside = (ratio >= low) & (ratio <= high)
        mask = response_mask * inside.to(response_mask.dtype)
        changed = ~inside & response_mask.bool()
        return Correction(mask.to(ratio.dtype), mask, _stats(ratio, response_mask, changed, level))


def decoupled_ppo_token_loss(log_probs: torch.Tensor, proximal_log_probs: torch.Tensor,
                             behaviour_log_probs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor,
                             clip_low: float, clip_high: float, behaviour_cap: float | None = None) -> torch.Tensor:
    """Per-token decoupled PPO loss ``[B, R]`` (0 outside the mask): ``w · max(−A·r, −A·clip(r, 1−low, 1+high))``
    with ``r = π_θ / π_prox`` and the detached ``w = π_prox / π_behav`` (``min(w, behaviour_cap)`` when given). With
    behaviour = proximal it is PPO's clipped loss. Aggregate it with ``aggregation.aggregate_loss``."""
    ratio = torch.exp((log_probs - proximal_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    surrogate = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - clip_low, 1 + clip_high))
    with torch.no_grad():
        weight = torch.exp((proximal_log_probs - behaviour_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        if behaviour_cap is not None:
            weight = weight.clamp(max=behaviour_cap)
    return weight * surrogate * response_mask
