"""Config of the anti-forgetting features: PPO-ptx (``actor.ptx``), EWC (``actor.ewc``) and prompt replay
(``data.replay``). Each is off by default; the mechanics live in ``hybridrl.engines.anti_forgetting`` (ptx, EWC)
and ``hybridrl.trainers.continual`` (SFT batches, replay mixing)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridrl.config.frozen import FreezableConfig


@dataclass
class PtxConfig(FreezableConfig):
    coef: float = 0.0
    """PPO-ptx: weight of a supervised loss (token-mean NLL of SFT targets, its own global normaliser) added to every
    actor optimizer step; 0 turns it off. Logged as ``actor/ptx/sft_loss``."""
    batch_size: int = 0
    """SFT sequences per training step (global), cut into one equal chunk per optimizer step: must be a multiple of
    devices × optimizer steps per epoch (``data.train_batch_size ÷ actor.ppo_mini_batch_size``)."""
    train_files: list[str] = field(default_factory=list)
    """SFT rows (parquet/JSONL in the RL schema; the target is ``extra_info.answer``, else
    ``reward_model.ground_truth``), cycled in order. Empty = the SFT view of ``data.synthetic_task`` (a seeded stream
    of its own, independent of the RL prompts)."""


@dataclass
class EWCConfig(FreezableConfig):
    coef: float = 0.0
    """EWC strength λ: adds ``λ/2 Σ F (θ − θ*)²`` to the actor loss, ``θ*`` the weights before the first update and
    ``F`` a diagonal Fisher estimated on the first step's rollouts; 0 turns it off. Logged as ``actor/ewc/penalty``."""
    fisher_batches: int = 1
    """K: the first step's rollout rows on each rank are cut into K batches; ``F`` is the mean of their squared
    gradients. Must divide the per-rank rows of a step (``data.train_batch_size × rollout.n ÷ devices``)."""


@dataclass
class ReplayConfig(FreezableConfig):
    enable: bool = False
    """Prioritized prompt replay for continual RL: a share of each step's prompts is drawn from earlier steps'
    prompts (with fresh uids), the rest come from the loader (the loader prompts it displaces are skipped)."""
    capacity: int = 1024
    """Prompts kept; when full, the lowest-priority one is evicted. The buffer is saved in trainer checkpoints."""
    fraction: float = 0.25
    """Share of ``data.train_batch_size`` taken from the buffer each step (once it holds enough), in (0, 1)."""
    alpha: float = 1.0
    """Priority exponent: prompts are drawn ∝ (priority + 1e-3)^alpha, the priority being the spread (std) of the
    prompt's rewards in its latest group; 0 = uniform."""
