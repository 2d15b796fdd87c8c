"""The Bradley–Terry preference loss of reward-model training, with an explicit global normaliser.

A reward model ``r`` scores a (prompt, response) sequence with one scalar. Under the Bradley–Terry model the
probability that the chosen response beats the rejected one is ``σ(r_c − r_r)``; the loss is its negative
log-likelihood, averaged over pairs:

    L = Σ_i [ −log σ(r_c,i − r_r,i − m_i) + λ · (r_c,i + r_r,i)² ] / N

- ``m_i`` — an optional margin per pair (Llama 2's rating-gap margin, or a constant): the chosen reward must beat
  the rejected one by at least ``m_i`` before the loss flattens;
- ``λ`` — the centring regulariser's coefficient (Eisenstein et al. 2023, "Helping or Herding?"): it pins the mean
  reward of a pair near zero, since the Bradley–Terry loss only sees reward *differences* and leaves the offset free;
- ``N`` — the **global** pair count of the mini-batch (all micro-batches, all ranks). Every term is per pair, so the
  micro-batch losses divided by ``N`` add up to the big-batch loss, in value and gradient (the accumulation invariant).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss"]


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, *,
                       normalizer: torch.Tensor | float, margin: Optional[torch.Tensor] = None,
                       center_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's additive share of the mini-batch Bradley–Terry loss, and its metrics.

    Args:
        chosen_rewards, rejected_rewards: ``[B]`` scalar rewards of each pair's two sequences.
        normalizer: the mini-batch's global pair count (a number or a 0-dim tensor), floored at 1.
        margin: ``[B]`` per-pair margin ``m_i`` (reward units), or ``None`` for 0.
        center_coef: ``λ`` of the centring regulariser ``λ·(r_c + r_r)²`` (0 disables it).

    Returns:
        ``(loss, metrics)``: ``loss`` a 0-dim tensor; ``metrics`` (detached, 0-dim) — ``loss`` (the same share),
        and per-micro-batch means ``accuracy`` (fraction with ``r_c > r_r``), ``margin`` (``r_c − r_r``),
        ``chosen_reward``, ``rejected_reward``.
    """
    if chosen_rewards.shape != rejected_rewards.shape or chosen_rewards.dim() != 1:
        raise ValueError(f"chosen_rewards {tuple(chosen_rewards.shape)} and rejected_rewards "
                         f"{tuple(rejected_rewards.shape)} must both be [batch]")
    if center_coef < 0:
        raise ValueError(f"center_coef must be >= 0, got {center_coef}")
    difference = chosen_rewards - rejected_rewards
    shifted = difference if margin is None else difference - margin.to(difference.dtype)
    per_pair = F.softplus(-shifted)  # −log σ(x), stable for large |x|
    if center_coef:
        per_pair = per_pair + center_coef * (chosen_rewards + rejected_rewards) ** 2
    denominator = torch.as_tensor(normalizer, dtype=per_pair.dtype, device=per_pair.device).clamp_min(1)
    loss = per_pair.sum() / denominator
    detached = difference.detach()
    metrics = {"loss": loss.detach(), "accuracy": (detached > 0).float().mean(), "margin": detached.mean(),
               "chosen_reward": chosen_rewards.detach().mean(), "rejected_reward": rejected_rewards.detach().mean()}
    return loss, metrics
