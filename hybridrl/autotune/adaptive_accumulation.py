"""``actor.adaptive_accumulation``: the actor's accumulation steps follow the gradient noise scale between updates.

The rule is :class:`~hybridrl.autotune.grad_noise.AdaptiveAccumulation` (hysteresis, bounds, an explicit learning-rate
multiplier); this module applies it in the training loop:

- **When.** The steps ``K`` hold for a whole ``update_actor`` call (every PPO epoch and mini-batch of one training
  step) and are reconsidered after it, from the latest noise-scale estimate. The micro-batch stays fixed, so the
  per-rank mini-batch is ``micro × K`` and the global one ``micro × K × world``; only ``K`` that divide the rank's
  sequences of a training step are allowed. Each mini-batch's loss is divided by *its own* global normaliser
  (``accumulation.global_normalizer``), so an update at any ``K`` still equals one big batch of ``micro × K × world``
  sequences.
- **Learning rate.** The configured rate was tuned at the configured ``K_ref``; at ``K`` it is multiplied by
  ``(K / K_ref)^p`` (``lr_scaling``). The schedule (warm-up, cosine) advances by *samples*: ``K / K_ref`` scheduler
  steps per optimizer step (fractions carried over), so it ends when the run ends whatever ``K`` was.
"""

from __future__ import annotations

from typing import Optional

import torch

from hybridrl.config.schema import AdaptiveAccumulationConfig
from hybridrl.autotune.grad_noise import AccumulationDecision, AdaptiveAccumulation, NoiseScaleEstimate


class ScaledSchedule:
    """A ``LambdaLR`` advanced by samples and scaled by a learning-rate multiplier; stands in for it in ``step()``.

    The wrapped scheduler (the one checkpoints save) keeps its own base rates and step count; after each of its steps
    the optimizer's rates are set to ``scheduled × multiplier``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.multiplier = 1.0
        self.steps_per_step = 1.0
        self._carry = 0.0

    def set(self, lr_multiplier: float, steps_per_step: float) -> None:
        """Scale the rate by ``lr_multiplier`` from now on; advance the schedule ``steps_per_step`` per step."""
        self.multiplier, self.steps_per_step = float(lr_multiplier), float(steps_per_step)
        self.apply()

    def apply(self) -> None:
        """Set each parameter group's rate to the schedule's current rate × the multiplier."""
        for group, rate in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = rate * self.multiplier

    def step(self) -> None:
        self._carry += self.steps_per_step
        while self._carry >= 1 - 1e-9:
            self.scheduler.step()
            self._carry -= 1
        self.apply()


def allowed_steps(config: AdaptiveAccumulationConfig, *, reference_steps: int, micro_batch_size: int,
                  local_step_sequences: int) -> tuple[int, ...]:
    """``min_steps × 2^k ≤ max_steps`` and ``reference_steps``, keeping those whose mini-batch divides the rank's
    ``local_step_sequences`` (a training step must cut into whole mini-batches)."""
    ladder, steps = {reference_steps}, config.min_steps
    while steps <= config.max_steps:
        ladder.add(steps)
        steps *= 2
    return tuple(sorted(k for k in ladder if local_step_sequences % (micro_batch_size * k) == 0))


class AccumulationControl:
    """The actor's current accumulation steps and the learning-rate schedule that goes with them.

    Args:
        rule: when and where to move the steps.
        micro_batch_size: sequences per micro-batch on one rank (fixed).
        reference_steps: the configured steps ``K_ref`` (the learning rate was tuned there); the starting point.
        world_size: data-parallel ranks (for the effective batch metric).
        schedule: the optimizer's schedule, wrapped.
    """

    def __init__(self, rule: AdaptiveAccumulation, *, micro_batch_size: int, reference_steps: int, world_size: int,
                 schedule: ScaledSchedule) -> None:
        self.rule = rule
        self.micro_batch_size = micro_batch_size
        self.reference_steps = reference_steps
        self.world_size = world_size
        self.schedule = schedule
        self.steps = reference_steps
        self.last_decision: Optional[AccumulationDecision] = None

    @classmethod
    def from_config(cls, config: AdaptiveAccumulationConfig, optimizer: torch.optim.Optimizer, scheduler, *,
                    micro_batch_size: int, reference_steps: int, world_size: int,
                    local_step_sequences: int) -> "AccumulationControl":
        if not config.min_steps <= reference_steps <= config.max_steps:
            raise ValueError(f"actor.adaptive_accumulation: [{config.min_steps}, {config.max_steps}] must contain the "
                             f"configured {reference_steps} accumulation steps")
        choices = allowed_steps(config, reference_steps=reference_steps, micro_batch_size=micro_batch_size,
                                local_step_sequences=local_step_sequences)
        rule = AdaptiveAccumulation(min_steps=config.min_steps, max_steps=config.max_steps,
                                    reference_steps=reference_steps, lr_scaling=config.lr_scaling,
                                    tolerance=config.tolerance, min_updates=config.min_updates, choices=choices)
        return cls(rule, micro_batch_size=micro_batch_size, reference_steps=reference_steps, world_size=world_size,
                   schedule=ScaledSchedule(optimizer, scheduler))

    @property
    def local_mini_batch_size(self) -> int:
        """Sequences per optimizer step on one rank: ``micro × K``."""
        return self.micro_batch_size * self.steps

    def metrics(self) -> dict[str, float]:
        """The steps in use, the effective (global) batch in sequences, and the learning-rate multiplier."""
        return {"accumulation/grad_accum_steps": float(self.steps),
                "accumulation/effective_batch_sequences": float(self.local_mini_batch_size * self.world_size),
                "accumulation/lr_multiplier": self.schedule.multiplier}

    def update(self, batch_size: float, estimate: Optional[NoiseScaleEstimate]) -> AccumulationDecision:
        """Reconsider the steps after an update whose last mini-batch held ``batch_size`` normaliser units."""
        decision = self.rule.decide(self.steps, batch_size, estimate)
        self.last_decision = decision
        if decision.changed:
            self.steps = decision.grad_accum_steps
            self.schedule.set(decision.lr_multiplier, self.steps / self.reference_steps)
        return decision
