"""``async_training`` (overlapping generation with training) and ``algorithm.off_policy_correction`` (off-policy
importance corrections): the configuration of ``trainers/async_rollout.py`` and ``algorithms/off_policy.py``."""

from __future__ import annotations

from dataclasses import dataclass

from hybridrl.config.frozen import FreezableConfig

ASYNC_MODES = ("sync", "one_step_off", "bounded")
CORRECTION_KINDS = ("auto", "none", "tis", "mis")
CORRECTION_LEVELS = ("token", "sequence")


@dataclass
class AsyncTrainingConfig(FreezableConfig):
    mode: str = "sync"
    """``sync``: every step generates with the weights it then trains (today's loop). ``one_step_off``: the
    standalone rollout pool generates step k+1's batch while the trainer trains step k (``bounded`` with η = 1).
    ``bounded``: up to ``max_staleness`` batches are generated ahead; a sample generated with weights of version v
    is trained only at versions <= v + η. Async modes need the standalone pool (``rollout.n_gpus > 0``)."""
    max_staleness: int = 1
    """η of ``bounded``: how many optimizer steps older than the trainer a sample's weights may be (0 = sync)."""
    partial_rollout: bool = False
    """Let a generation in flight take new weights: between engine steps a replica that sees a newer publication
    parks its requests (pause ``keep``), loads, and resumes them, so a row's later tokens come from fresher weights
    (``token_policy_versions``; the row's staleness is its oldest token's, so the bound holds as without). The
    switch point depends on timing: runs are no longer reproducible bit for bit. Replicas of
    ``tensor_model_parallel_size`` 1, single-turn generation."""

    @property
    def staleness_bound(self) -> int:
        """η in force: 0 for ``sync``, 1 for ``one_step_off``, ``max_staleness`` for ``bounded``."""
        return {"sync": 0, "one_step_off": 1}.get(self.mode, self.max_staleness)


@dataclass
class OffPolicyCorrectionConfig(FreezableConfig):
    kind: str = "auto"
    """Off-policy correction of the policy loss by the ratio π_old / π_rollout (trainer's recomputed log-probs over
    the rollout engine's): ``auto`` (``tis`` when ``async_training`` trains on stale samples — its staleness bound is
    > 0 — else ``none``) | ``none`` | ``tis`` (truncated importance weights, ``min(ratio, cap)``; at token level with
    recomputed old log-probs this is decoupled PPO) | ``mis`` (masked: tokens or sequences whose ratio leaves
    ``[low, high]`` take no loss). Needs the old-log-prob forward (run whatever ``actor.old_log_prob`` says).
    Measured on the demo (``benchmarks/async_modes.py``, two seeds): η = 2 without a correction ended 5–7 points
    below sync; with ``tis`` level with it."""
    level: str = "token"
    """``token``: one ratio per token. ``sequence``: one per response (the product of its tokens' ratios)."""
    cap: float = 2.0
    """``tis``: the largest weight (C > 0)."""
    low: float = 0.5
    """``mis``: the smallest ratio kept (0 <= low <= 1)."""
    high: float = 2.0
    """``mis``: the largest ratio kept (>= 1)."""

    def resolved_kind(self, staleness_bound: int) -> str:
        """The correction in force for a run whose ``async_training`` staleness bound is ``staleness_bound``."""
        if self.kind == "auto":
            return "tis" if staleness_bound > 0 else "none"
        return self.kind
