"""On-policy distillation: a frozen teacher scores the student's own samples token by token, and the per-token
reverse KL ``log π_s(y_t) − log π_t(y_t)`` (a one-sample estimate of KL(π_s ‖ π_t) at that position) pulls the student
towards the teacher where it sampled.

The term enters the policy gradient as a per-token advantage: ``A_t = w · A_task,t − λ · (log π_s,t − log π_t,t)``
on the response's model tokens (``response_mask``), with ``w`` the task advantage's weight (0: distillation alone)
and ``λ`` the KL's. Each token's own KL is its advantage — no return over later tokens (a discount of 0: the
teacher already scored every continuation the student did not take). The student's log-probs are the trainer's
``old_log_probs``, held fixed (the advantage carries no gradient): those of the weights that sampled in synchronous
training; in asynchronous training, of the weights being trained, the samples up to ``max_staleness`` versions
older (as the update's own ratio sees them).
"""

from __future__ import annotations

import torch

from hybridrl.algorithms.masked import masked_mean

__all__ = ["distillation_advantages"]


@torch.no_grad()
def distillation_advantages(task_advantages: torch.Tensor, student_log_probs: torch.Tensor,
                            teacher_log_probs: torch.Tensor, response_mask: torch.Tensor, *, kl_coef: float,
                            task_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """``[B, R]`` advantages with the teacher's term (module docstring), and ``distill/*`` metrics: the reverse KL
    per token (mean over model tokens) and per sequence (sum over a row's tokens, mean over rows with any).

    Args:
        task_advantages: ``[B, R]`` the task's advantages (any estimator's).
        student_log_probs, teacher_log_probs: ``[B, R]`` log-probs (nats) of the sampled tokens.
        response_mask: ``[B, R]`` 1 on the model's own tokens (observations of a multi-turn episode take no term).
        kl_coef: ``λ`` ≥ 0; task_weight: ``w`` ≥ 0.
    """
    mask = response_mask.to(student_log_probs.dtype)
    reverse_kl = (student_log_probs - teacher_log_probs) * mask
    advantages = (task_weight * task_advantages - kl_coef * reverse_kl) * mask
    per_sequence = reverse_kl.sum(-1)
    rows = response_mask.sum(-1) > 0
    metrics = {"distill/reverse_kl_per_token": float(masked_mean(reverse_kl, mask)),
               "distill/reverse_kl_per_sequence": float(per_sequence[rows].mean()) if bool(rows.any()) else 0.0,
               "distill/teacher_log_prob": float(masked_mean(teacher_log_probs, mask))}
    return advantages, metrics
