"""Advantage estimators: token-level rewards (+ values / group ids) → ``(advantages, returns)``.

Every estimator is registered in :data:`ADVANTAGE_ESTIMATORS` under verl's ``algorithm.adv_estimator`` name and is
called with keyword arguments only, using verl's argument names. Each takes what it needs and swallows the rest
through ``**unused``, so the trainer can pass one uniform set::

    advantages, returns = ADVANTAGE_ESTIMATORS[cfg.adv_estimator](
        token_level_rewards=..., values=..., response_mask=..., index=uids, gamma=..., lam=..., epsilon=1e-6,
        norm_adv_by_std_in_grpo=True, reward_baselines=...)

Shapes: every tensor argument and both outputs are ``[batch, response_len]``, except ``reward_baselines``
(``[batch]``) and ``index`` (one hashable group id per row). Advantages are exactly 0 on masked positions
(verl leaves whitening residue there for GAE; no loss reads those positions, so this only makes outputs tidy).
Estimators run under ``torch.no_grad()``: advantages are targets, never differentiated.

Outcome estimators (GRPO family, RLOO) score a row by the sum of its rewards over *valid* tokens (verl sums the
whole row; rewards are zero on padding, so the two agree on well-formed input).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

from hybridrl.algorithms.masked import masked_sum, masked_whiten
from hybridrl.utils.registry import Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "group_ids",
    "compute_gae",
    "compute_grpo",
    "compute_drgrpo",
    "compute_rloo",
    "compute_reinforce_plus_plus",
    "compute_reinforce_plus_plus_baseline",
    "compute_remax",
]

AdvantageEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]
ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator")

# Per-row group labels: an integer tensor, a list of hashables, or a numpy (object / str / int) array of uids.
GroupIndex = Any


def _check_shapes(reference: torch.Tensor, **tensors: torch.Tensor) -> None:
    if reference.dim() != 2:
        shape = tuple(reference.shape)
        raise ValueError(f"expected [batch, response_len] tensors, got token_level_rewards of shape {shape}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(reference.shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(reference.shape)}")


def _zero_masked(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return torch.where(response_mask.bool(), values, torch.zeros_like(values))


def group_ids(index: GroupIndex, batch_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Dense group ids ``[batch]`` (int64, values ``0..num_groups-1``) from any per-row group labels.

    ``index`` may be an integer tensor, a list, or a numpy array (including object / string arrays of uids);
    rows with equal labels form one group (responses to the same prompt).
    """
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != batch_size:
            raise ValueError(f"index must be a 1-D tensor of length {batch_size}, got shape {tuple(index.shape)}")
        return torch.unique(index, return_inverse=True)[1].to(device=device, dtype=torch.long)
    labels = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(labels) != batch_size:
        raise ValueError(f"index has {len(labels)} entries, expected one per row ({batch_size})")
    dense: dict[Hashable, int] = {}
    try:
        ids = [dense.setdefault(label, len(dense)) for label in labels]
    except TypeError as error:
        raise TypeError(f"index entries must be hashable group labels: {error}") from None
    return torch.tensor(ids, dtype=torch.long, device=device)


def _group_mean_std(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std and group size ``[batch]``; singletons get mean 0, std 1 (as verl)."""
    num_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    counts = torch.bincount(ids, minlength=num_groups).to(scores.dtype)
    sums = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device).index_add_(0, ids, scores)
    mean = sums / counts.clamp_min(1)
    squares = torch.zeros_like(sums).index_add_(0, ids, (scores - mean[ids]) ** 2)
    std = torch.sqrt(squares / (counts - 1).clamp_min(1))
    singleton = counts == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    return mean[ids], std[ids], counts[ids]


@ADVANTAGE_ESTIMATORS.register("gae")
@torch.no_grad()
def compute_gae(
    *,
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015), with verl's handling of masked tokens.

    Backwards over t: ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where
    ``V_next`` / ``A_next`` come from the next *valid* token (masked tokens, e.g. tool observations in the middle
    of a response, are skipped: they carry the following valid token's advantage and contribute no TD error).
    ``returns = A + values`` uses the raw advantages; then ``A`` is whitened over valid tokens (``whiten=False``
    keeps the raw advantages, for tests and analysis).
    """
    _check_shapes(token_level_rewards, values=values, response_mask=response_mask)
    valid = response_mask.bool()
    next_value = torch.zeros_like(token_level_rewards[:, 0])
    last_advantage = torch.zeros_like(next_value)
    advantages = torch.empty_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * last_advantage
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        last_advantage = torch.where(valid[:, t], advantage_t, last_advantage)
        advantages[:, t] = last_advantage
    returns = advantages + values
    if whiten:
        return masked_whiten(advantages, response_mask), returns
    return _zero_masked(advantages, response_mask), returns


def _group_normalised_scores(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float,
    divide_by_std: bool,
) -> torch.Tensor:
    """GRPO's sequence advantage ``(score - group mean) [/ (group std + epsilon)]`` broadcast over valid tokens."""
    _check_shapes(token_level_rewards, response_mask=response_mask)
    scores = masked_sum(token_level_rewards, response_mask, dim=-1)
    mean, std, _ = _group_mean_std(scores, group_ids(index, scores.shape[0], scores.device))
    advantage = scores - mean
    if divide_by_std:
        advantage = advantage / (std + epsilon)
    return _zero_masked(advantage.unsqueeze(-1).expand_as(token_level_rewards), response_mask)


@ADVANTAGE_ESTIMATORS.register("grpo")
@torch.no_grad()
def compute_grpo(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024): ``(s_i - mean_g) / (std_g + epsilon)`` on every valid token.

    ``s_i`` is the sum of row i's token rewards; mean and unbiased std are over the rows of its group (same
    ``index``). A group of one gets mean 0 and std 1, so its advantage is ``s_i / (1 + epsilon)`` (verl's rule).
    ``norm_adv_by_std_in_grpo=False`` skips the division (Dr. GRPO). Returns are the advantages.
    """
    advantages = _group_normalised_scores(
        token_level_rewards, response_mask, index, epsilon, divide_by_std=norm_adv_by_std_in_grpo
    )
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("drgrpo")
@torch.no_grad()
def compute_drgrpo(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex, **unused: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO (Liu et al. 2025): GRPO without the std division, ``s_i - mean_g``, whatever
    ``norm_adv_by_std_in_grpo`` says (the name selects the algorithm; verl spells it grpo + that flag)."""
    advantages = _group_normalised_scores(token_level_rewards, response_mask, index, 0.0, divide_by_std=False)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("rloo")
@torch.no_grad()
def compute_rloo(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex, **unused: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): ``s_i - mean of the other rows' scores in the group``.

    Equivalently ``(n * s_i - sum_g) / (n - 1)`` for a group of n > 1. A group of one keeps its raw score
    (verl's ``rloo``; its ``rloo_vectorized`` variant gives 0 there instead). Returns are the advantages.
    """
    _check_shapes(token_level_rewards, response_mask=response_mask)
    scores = masked_sum(token_level_rewards, response_mask, dim=-1)
    mean, _, counts = _group_mean_std(scores, group_ids(index, scores.shape[0], scores.device))
    leave_one_out = (counts * scores - counts * mean) / (counts - 1).clamp_min(1)
    advantage = torch.where(counts > 1, leave_one_out, scores)
    advantages = _zero_masked(advantage.unsqueeze(-1).expand_as(token_level_rewards), response_mask)
    return advantages, advantages


def _discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_{t+1}``, with the carried return reset to 0 after every masked token."""
    valid = response_mask.bool()
    returns = torch.empty_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = torch.where(valid[:, t], running, torch.zeros_like(running))
    return returns


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **unused: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over all valid tokens of the batch.

    Returns the whitened advantages and the raw (unwhitened) returns.
    """
    _check_shapes(token_level_rewards, response_mask=response_mask)
    returns = _discounted_returns(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask), returns


@ADVANTAGE_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: GroupIndex, **unused: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: ``s_i - group mean`` (mean 0 for a group of one) broadcast over valid tokens, then
    whitened over all valid tokens of the batch. Returns are the advantages."""
    advantages = _group_normalised_scores(token_level_rewards, response_mask, index, 0.0, divide_by_std=False)
    advantages = masked_whiten(advantages, response_mask)
    return advantages, advantages


@ADVANTAGE_ESTIMATORS.register("remax")
@torch.no_grad()
def compute_remax(
    *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor, **unused: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): undiscounted return-to-go minus the greedy response's reward.

    ``reward_baselines`` is ``[batch]``: the reward of the greedy (argmax) response to the same prompt, broadcast
    over valid tokens. Returns are the return-to-go of the masked rewards.
    """
    _check_shapes(token_level_rewards, response_mask=response_mask)
    if reward_baselines.numel() != token_level_rewards.shape[0]:
        raise ValueError(f"reward_baselines must have one entry per row, got shape {tuple(reward_baselines.shape)}")
    masked_rewards = _zero_masked(token_level_rewards, response_mask)
    returns = masked_rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    baseline = reward_baselines.reshape(-1, 1).to(returns.dtype)
    return _zero_masked(returns - baseline, response_mask), returns
