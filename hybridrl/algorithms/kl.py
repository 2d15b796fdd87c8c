"""Per-token KL estimators between the policy and the reference policy (Schulman, "Approximating KL Divergence").

All take log-probs in nats of the *sampled* tokens under both policies, ``[batch, response_len]``, and return a
same-shape per-token estimate of ``KL(policy || reference)``; aggregate it with
:func:`hybridrl.algorithms.aggregation.aggregate_loss` (KL loss) or subtract it from rewards (KL in reward).
"""

from __future__ import annotations

import torch

__all__ = ["KL_PENALTY_KINDS", "kl_penalty"]

# Names follow verl's ``kl_loss_type`` / ``kl_penalty`` (two spellings for three of the estimators).
KL_PENALTY_KINDS: tuple[str, ...] = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")

# k3 clamps, as verl: the log-ratio to ±20 before exp (no overflow), and the estimate itself to ±10.
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate, ``[batch, response_len]``, from policy and reference log-probs of the same tokens.

    With ``d = logprob - ref_logprob``:

    - ``k1`` / ``kl``: ``d`` (unbiased, high variance, can be negative);
    - ``abs``: ``|d|``;
    - ``k2`` / ``mse``: ``d**2 / 2`` (biased, low variance; its gradient is the true KL gradient on-policy);
    - ``k3`` / ``low_var_kl``: ``exp(-d) - 1 + d`` (unbiased, non-negative), computed with ``-d`` clamped to
      ``[-20, 20]`` and the result clamped to ``[-10, 10]`` exactly as verl does.

    Raises:
        ValueError: for an unknown ``kind``, naming it and the valid kinds.
    """
    if kind in ("k1", "kl"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("k3", "low_var_kl"):
        log_ratio = torch.clamp(ref_logprob - logprob, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
        # expm1(x) - x, not exp(x) - 1 - x: for small x the latter rounds below zero (a negative "KL").
        estimate = torch.expm1(log_ratio) - log_ratio
        return torch.clamp(estimate, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)
    raise ValueError(f"unknown KL penalty kind {kind!r}; valid kinds: {', '.join(KL_PENALTY_KINDS)}")
