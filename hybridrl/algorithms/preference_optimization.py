"""Offline preference optimisation losses — DPO (with label smoothing: cDPO), IPO, SimPO, ORPO, KTO — as pure
functions of sequence log-probabilities, each with an explicit global normaliser.

Notation, per pair ``i``: ``π_c``, ``π_r`` the policy's log-probabilities of the chosen and rejected responses (summed
over their tokens, unless a loss says otherwise), ``ρ_c``, ``ρ_r`` the reference policy's, and the implicit reward
margin ``h = (π_c − ρ_c) − (π_r − ρ_r)``.

- **DPO** (Rafailov et al. 2023): ``−log σ(β h)``; with label smoothing ``ε`` (cDPO: a share ``ε`` of the labels is
  taken to be flipped) ``−(1 − ε) log σ(β h) − ε log σ(−β h)``.
- **IPO** (Azar et al. 2023): ``(h − 1/(2β))²`` — regresses the margin to a target instead of pushing it to infinity.
  The paper writes ``h`` with summed log-probs; TRL averages them over each response's tokens: the caller chooses
  by what it passes.
- **SimPO** (Meng et al. 2024): reference-free, ``−log σ(β (π_c/|c| − π_r/|r|) − γ)`` with response lengths ``|c|``,
  ``|r|`` in tokens and a target margin ``γ``.
- **ORPO** (Hong et al. 2024): reference-free, the chosen responses' negative log-likelihood — a mean over all
  their tokens in the mini-batch, as TRL computes it (the paper averages per sequence first, so there a long
  response weighs no more than a short one) — plus ``λ · −log σ(log odds_c − log odds_r)``, where
  ``log odds = ℓ − log(1 − e^ℓ)`` of the mean per-token log-prob ``ℓ``.
- **KTO** (Ethayarajh et al. 2024): unpaired rows, each desirable or undesirable, with ``r = π − ρ`` per row and a
  reference point ``z₀`` (a detached estimate of KL(π‖ρ), at least 0): desirable rows cost ``λ_D (1 − σ(β (r − z₀)))``,
  undesirable ones ``λ_U (1 − σ(β (z₀ − r)))``.

Every term is per pair (per row for KTO; per token for ORPO's likelihood term), so a micro-batch's sum divided by the
**global** count of the mini-batch (all micro-batches, all ranks) adds up to the big batch's loss, value and gradient
alike — the accumulation invariant. ``z₀`` must likewise be computed over the whole mini-batch by the caller.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["dpo_loss", "ipo_loss", "simpo_loss", "orpo_loss", "kto_loss", "preference_metrics"]

Tensor = torch.Tensor


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor, reference_rejected: Tensor,
             *, beta: float, normalizer: Tensor | float, label_smoothing: float = 0.0) -> tuple[Tensor, dict]:
    """DPO / cDPO: this micro-batch's additive share of the mini-batch loss, and its metrics.

    Args:
        policy_chosen, policy_rejected, reference_chosen, reference_rejected: ``[B]`` sequence log-probs.
        beta: ``β`` > 0, the strength of the implicit KL constraint.
        normalizer: the mini-batch's global pair count (a number or a 0-dim tensor), floored at 1.
        label_smoothing: ``ε`` in ``[0, 0.5)``: the assumed share of flipped labels (0: plain DPO).
    """
    _check_beta(beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_reward, rejected_reward = _implicit_rewards(policy_chosen, policy_rejected, reference_chosen,
                                                       reference_rejected)
    logits = beta * (chosen_reward - rejected_reward)
    per_pair = (1.0 - label_smoothing) * F.softplus(-logits) + label_smoothing * F.softplus(logits)
    return _share(per_pair, normalizer), preference_metrics(beta * chosen_reward, beta * rejected_reward)


def ipo_loss(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor, reference_rejected: Tensor,
             *, beta: float, normalizer: Tensor | float) -> tuple[Tensor, dict]:
    """IPO: ``(h − 1/(2β))²`` per pair (arguments as :func:`dpo_loss`)."""
    _check_beta(beta)
    chosen_reward, rejected_reward = _implicit_rewards(policy_chosen, policy_rejected, reference_chosen,
                                                       reference_rejected)
    per_pair = (chosen_reward - rejected_reward - 1.0 / (2.0 * beta)) ** 2
    return _share(per_pair, normalizer), preference_metrics(beta * chosen_reward, beta * rejected_reward)


def simpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, chosen_lengths: Tensor, rejected_lengths: Tensor,
               *, beta: float, gamma: float, normalizer: Tensor | float) -> tuple[Tensor, dict]:
    """SimPO: ``−log σ(β (π_c/|c| − π_r/|r|) − γ)`` per pair.

    Args:
        policy_chosen, policy_rejected: ``[B]`` summed sequence log-probs of the policy.
        chosen_lengths, rejected_lengths: ``[B]`` response lengths in tokens (≥ 1).
        beta: ``β`` > 0; gamma: the target reward margin ``γ`` (≥ 0).
        normalizer: the global pair count.
    """
    _check_beta(beta)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    _check_pairs(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths)
    chosen_reward = beta * policy_chosen / chosen_lengths.clamp_min(1).to(policy_chosen.dtype)
    rejected_reward = beta * policy_rejected / rejected_lengths.clamp_min(1).to(policy_rejected.dtype)
    per_pair = F.softplus(-(chosen_reward - rejected_reward - gamma))
    return _share(per_pair, normalizer), preference_metrics(chosen_reward, rejected_reward)


def orpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, chosen_lengths: Tensor, rejected_lengths: Tensor,
              *, lam: float, pair_normalizer: Tensor | float,
              token_normalizer: Tensor | float) -> tuple[Tensor, dict]:
    """ORPO: the chosen responses' token-mean negative log-likelihood plus ``λ`` times the odds-ratio term.

    Args:
        policy_chosen, policy_rejected: ``[B]`` summed sequence log-probs of the policy.
        chosen_lengths, rejected_lengths: ``[B]`` response lengths in tokens (≥ 1).
        lam: ``λ`` ≥ 0, the odds-ratio term's weight.
        pair_normalizer: the global pair count (the odds-ratio term is a mean over pairs).
        token_normalizer: the global count of chosen-response tokens (the likelihood term is a mean over tokens).
    """
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    _check_pairs(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths)
    chosen_mean = policy_chosen / chosen_lengths.clamp_min(1).to(policy_chosen.dtype)
    rejected_mean = policy_rejected / rejected_lengths.clamp_min(1).to(policy_rejected.dtype)
    log_odds = _log_odds(chosen_mean) - _log_odds(rejected_mean)
    likelihood = _share(-policy_chosen, token_normalizer)
    odds_ratio = _share(F.softplus(-log_odds), pair_normalizer)
    metrics = preference_metrics(chosen_mean, rejected_mean)
    metrics.update(nll=likelihood.detach(), log_odds_ratio=log_odds.detach().mean())
    return likelihood + lam * odds_ratio, metrics


def kto_loss(policy: Tensor, reference: Tensor, desirable: Tensor, *, beta: float, reference_point: Tensor | float,
             normalizer: Tensor | float, desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[Tensor, dict]:
    """KTO on unpaired rows.

    Args:
        policy, reference: ``[B]`` sequence log-probs of each row's response.
        desirable: ``[B]`` bool, the row's label.
        beta: ``β`` > 0.
        reference_point: ``z₀``, the mini-batch's detached KL estimate (clamped at 0 here).
        normalizer: the global row count.
        desirable_weight, undesirable_weight: ``λ_D``, ``λ_U`` (> 0), to balance unequal label counts.
    """
    _check_beta(beta)
    if desirable_weight <= 0 or undesirable_weight <= 0:
        raise ValueError(f"desirable_weight and undesirable_weight must be > 0, got {desirable_weight}, "
                         f"{undesirable_weight}")
    if policy.shape != reference.shape or policy.shape != desirable.shape or policy.dim() != 1:
        raise ValueError(f"policy {tuple(policy.shape)}, reference {tuple(reference.shape)} and desirable "
                         f"{tuple(desirable.shape)} must all be [batch]")
    z0 = torch.as_tensor(reference_point, dtype=policy.dtype, device=policy.device).detach().clamp_min(0)
    log_ratio = policy - reference.detach()
    desired = desirable.bool()
    per_row = torch.where(desired, desirable_weight * (1.0 - torch.sigmoid(beta * (log_ratio - z0))),
                          undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - log_ratio))))
    rewards = (beta * log_ratio).detach()
    metrics = {"chosen_reward": _masked_mean(rewards, desired), "rejected_reward": _masked_mean(rewards, ~desired),
               "reference_point": z0}
    return _share(per_row, normalizer), metrics


def preference_metrics(chosen_rewards: Tensor, rejected_rewards: Tensor) -> dict[str, Tensor]:
    """Detached per-micro-batch means: ``chosen_reward``, ``rejected_reward``, ``margin`` and ``accuracy`` (the
    share of pairs whose chosen reward is the higher)."""
    chosen, rejected = chosen_rewards.detach(), rejected_rewards.detach()
    return {"chosen_reward": chosen.mean(), "rejected_reward": rejected.mean(), "margin": (chosen - rejected).mean(),
            "accuracy": (chosen > rejected).float().mean()}


def _implicit_rewards(policy_chosen: Tensor, policy_rejected: Tensor, reference_chosen: Tensor,
                      reference_rejected: Tensor) -> tuple[Tensor, Tensor]:
    _check_pairs(policy_chosen, policy_rejected, reference_chosen, reference_rejected)
    return policy_chosen - reference_chosen.detach(), policy_rejected - reference_rejected.detach()


def _log_odds(mean_log_prob: Tensor) -> Tensor:
    """``ℓ − log(1 − e^ℓ)`` for ``ℓ < 0``, in float32 at least: ``log(−expm1(ℓ))`` stays finite where ``1 − e^ℓ``
    would round to 0 (bf16 does for ``|ℓ| ≲ 2e-3``); ``ℓ`` is capped just below 0 (a probability of exactly 1)."""
    wide = mean_log_prob.to(torch.promote_types(mean_log_prob.dtype, torch.float32)).clamp_max(-1e-7)
    return wide - torch.log(-torch.expm1(wide))


def _share(per_item: Tensor, normalizer: Tensor | float) -> Tensor:
    denominator = torch.as_tensor(normalizer, dtype=per_item.dtype, device=per_item.device).clamp_min(1)
    return per_item.sum() / denominator


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """The mean of ``values`` where ``mask``; 0 (on their device) when nothing is."""
    return (values * mask).sum() / mask.sum().clamp_min(1)


def _check_beta(beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def _check_pairs(*tensors: Tensor) -> None:
    shapes = {tuple(tensor.shape) for tensor in tensors}
    if len(shapes) != 1 or tensors[0].dim() != 1:
        raise ValueError(f"the per-pair inputs must all be [batch] tensors of one size, got shapes "
                         f"{[tuple(tensor.shape) for tensor in tensors]}")
