"""Policy losses (PPO clip / GSPO / CISPO) and the clipped value loss.

Policy losses are registered in :data:`POLICY_LOSSES` under verl's ``policy_loss.loss_mode`` names and called
with keyword arguments only::

    loss, metrics = POLICY_LOSSES[name](
        old_log_prob=..., log_prob=..., advantages=..., response_mask=...,   # all [batch, response_len]
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
        loss_agg_mode="token-mean", normalizer=global_count, loss_scale_factor=None)

Log-probs are in nats, of the sampled tokens. ``normalizer`` / ``loss_scale_factor`` go straight to
:func:`~hybridrl.algorithms.aggregation.aggregate_loss` (see it for the micro-batching invariant); every loss
honours the ``loss_agg_mode`` it is given — none silently switches mode.

``metrics`` values are detached 0-dim tensors (no host sync inside the loss): ``pg_loss`` (the returned loss,
i.e. this micro-batch's contribution), and masked means over *this* micro-batch's valid tokens: ``pg_clipfrac``,
``pg_clipfrac_lower`` (dual-clip activations), ``ppo_kl`` (approximate ``KL(old || new)``, mean of
``old_log_prob - log_prob``). Averaging these over micro-batches is the caller's job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hybridrl.algorithms.aggregation import Normalizer, aggregate_loss
from hybridrl.algorithms.masked import masked_count, masked_mean, masked_sum
from hybridrl.utils.registry import Registry

__all__ = ["POLICY_LOSSES", "PolicyLoss", "vanilla_policy_loss", "gspo_policy_loss", "cispo_policy_loss", "value_loss"]

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")

# Per-token log-ratios are clamped before exp() for stability (verl's constants).
LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_MAX = 10.0


def _fraction(condition: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(condition.float(), response_mask).detach()


def _finish(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    normalizer: Normalizer | None,
    loss_scale_factor: float | None,
    metrics: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    loss = aggregate_loss(pg_losses, response_mask, loss_agg_mode, normalizer, loss_scale_factor)
    return loss, {"pg_loss": loss.detach(), **metrics}


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    normalizer: Normalizer | None = None,
    loss_scale_factor: float | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual clip (Ye et al. 2019).

    Per token, with ``r = exp(log_prob - old_log_prob)`` (log-ratio clamped to ±20) and advantage ``A``:
    ``L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))``; for ``A < 0`` it is further capped
    at ``-A * clip_ratio_c``, which bounds the loss when ``r`` explodes on a negative advantage.
    ``pg_clipfrac`` counts tokens where the clipped branch is active, ``pg_clipfrac_lower`` those where the
    dual-clip cap is.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_clip_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clip_loss, dual_clip_cap), clip_loss)
    metrics = {
        "pg_clipfrac": _fraction(clipped > unclipped, response_mask),
        "pg_clipfrac_lower": _fraction((clip_loss > dual_clip_cap) & negative, response_mask),
        "ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, normalizer, loss_scale_factor, metrics)


@POLICY_LOSSES.register("gspo")
def gspo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: Normalizer | None = None,
    loss_scale_factor: float | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025): PPO clipping on the sequence-level, length-normalised importance ratio.

    ``s_i = exp(mean_t (log_prob - old_log_prob))`` over row i's valid tokens (the geometric mean of token
    ratios). The per-token ratio is the paper's GSPO-token construction
    ``s_it = sg[s_i] * pi(y_t) / sg[pi(y_t)]``: its *value* is ``s_i`` on every token, and its gradient is
    ``s_i * grad log pi(y_t)``, so with ``seq-mean-token-mean`` (the paper's objective, and this function's
    default) the gradient equals the sequence-level GSPO gradient. The log of ``s_it`` is clamped at 10.
    verl forces ``seq-mean-token-mean`` here; we honour the mode given, so the normaliser always matches it.
    Clip ranges in GSPO are ~1e-4 wide (the defaults are the paper's). ``pg_clipfrac_lower`` is always 0.
    """
    log_ratio = log_prob - old_log_prob
    lengths = masked_count(response_mask, dim=-1).clamp_min(1).to(log_ratio.dtype)
    sequence_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / lengths
    token_log_ratio = log_prob - log_prob.detach() + sequence_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=GSPO_LOG_RATIO_MAX))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = torch.maximum(unclipped, clipped)
    metrics = {
        "pg_clipfrac": _fraction(clipped > unclipped, response_mask),
        "pg_clipfrac_lower": torch.zeros((), device=pg_losses.device),
        "ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, normalizer, loss_scale_factor, metrics)


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    normalizer: Normalizer | None = None,
    loss_scale_factor: float | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, 2025): ``L = -sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log_prob``.

    The clipped importance weight is a detached constant, so — unlike PPO — no token loses its gradient to
    clipping; the weight only bounds how much it counts. ``pg_clipfrac`` is the fraction of tokens whose weight
    was clipped; ``pg_clipfrac_lower`` is always 0.
    """
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    pg_losses = -weight * advantages * log_prob
    metrics = {
        "pg_clipfrac": _fraction(ratio != weight, response_mask),
        "pg_clipfrac_lower": torch.zeros((), device=pg_losses.device),
        "ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }
    return _finish(pg_losses, response_mask, loss_agg_mode, normalizer, loss_scale_factor, metrics)


def value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    normalizer: Normalizer | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped value loss: ``0.5 * agg(max((v - R)^2, (clip(v, V_old ± cliprange_value) - R)^2))``.

    Args:
        vpreds: current critic predictions ``[batch, response_len]`` (differentiated).
        values: critic predictions at rollout time (``V_old``), same shape.
        returns: regression targets ``R`` (e.g. GAE returns), same shape.
        response_mask, loss_agg_mode, normalizer, loss_scale_factor: as in ``aggregate_loss``.

    Returns:
        ``(loss, metrics)`` with detached ``vf_loss``, ``vf_clipfrac`` (fraction of valid tokens where the clipped
        error is the larger one) and ``vpred_mean``.
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped = (vpreds - returns) ** 2
    clipped = (vpreds_clipped - returns) ** 2
    loss = 0.5 * aggregate_loss(
        torch.maximum(unclipped, clipped), response_mask, loss_agg_mode, normalizer, loss_scale_factor
    )
    metrics = {
        "vf_loss": loss.detach(),
        "vf_clipfrac": _fraction(clipped > unclipped, response_mask),
        "vpred_mean": masked_mean(vpreds, response_mask).detach(),
    }
    return loss, metrics
