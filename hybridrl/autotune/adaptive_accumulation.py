"""``actor.adaptive_accumulation``: the actor's accumulation steps follow the gradient noise scale between updates.

The rule is :class:`AdaptiveAccumulation` (hysteresis, bounds, an explicit learning-rate multiplier) on the estimate
of :class:`~hybridrl.autotune.grad_noise.NoiseScaleMonitor`; :class:`AccumulationControl` applies it in the training
loop, as a hook of the actor's engine:

- **When.** The steps ``K`` hold for a whole ``update_actor`` call (every PPO epoch and mini-batch of one training
  step) and are reconsidered after it, from the latest noise-scale estimate. The micro-batch stays fixed, so the
  per-rank mini-batch is ``micro × K`` and the global one ``micro × K × world``; only ``K`` that divide the rank's
  sequences of a training step are allowed. Each mini-batch's loss is divided by *its own* global normaliser
  (``engines.losses.global_normalizer``), so an update at any ``K`` still equals one big batch of ``micro × K × world``
  sequences.
- **Learning rate.** The configured rate was tuned at the configured ``K_ref``; at ``K`` it is multiplied by
  ``(K / K_ref)^p`` (``lr_scaling``). The schedule (warm-up, cosine) advances by *samples*: ``K / K_ref`` scheduler
  steps per optimizer step (fractions carried over), so it ends when the run ends whatever ``K`` was.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch

from hybridrl.autotune.grad_noise import NoiseScaleEstimate, NoiseScaleMonitor
from hybridrl.config.schema import LR_SCALING_EXPONENTS, AdaptiveAccumulationConfig
from hybridrl.engines.hooks import EngineView, StepHook

logger = logging.getLogger(__name__)

LrScaling = Literal["linear", "sqrt", "none"]
LR_EXPONENTS = LR_SCALING_EXPONENTS  # owned by the config, which validates the names


@dataclass(frozen=True)
class AccumulationDecision:
    """The accumulation steps for the next optimizer steps, and the learning-rate multiplier that goes with them
    (relative to the learning rate configured at ``reference_steps``)."""

    grad_accum_steps: int
    lr_multiplier: float
    batch_size: float
    changed: bool
    reason: str


@dataclass(frozen=True)
class AdaptiveAccumulation:
    """Move the accumulation steps so that the mini-batch follows ``B_simple``, within ``[min_steps, max_steps]``.

    Steps are ``min_steps · 2^k`` (or ``choices``). Nothing changes until the estimator has ``min_updates`` updates,
    nor while ``B_simple`` stays within a factor ``tolerance`` of the current mini-batch (hysteresis: the estimate is
    noisy). Then the steps whose mini-batch is closest to ``B_simple`` in log scale are chosen.

    Learning rate: the configured rate was tuned at ``reference_steps``; at ``k`` steps it is multiplied by
    ``(k / reference_steps)^p``, ``p = 1`` (``linear``: Goyal et al. 2017, SGD below the critical batch),
    ``0.5`` (``sqrt``: Adam-family optimizers; Malladi et al. 2022), or ``0`` (``none``). The multiplier is returned
    with every decision so the caller applies it explicitly.
    """

    min_steps: int
    max_steps: int
    reference_steps: int
    lr_scaling: LrScaling = "sqrt"
    tolerance: float = 2.0
    min_updates: int = 10
    choices: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if self.reference_steps < 1:
            raise ValueError(f"reference_steps must be >= 1, got {self.reference_steps}")
        if self.lr_scaling not in LR_EXPONENTS:
            raise ValueError(f"lr_scaling must be one of {', '.join(LR_EXPONENTS)}, got {self.lr_scaling!r}")
        if self.tolerance < 1:
            raise ValueError(f"tolerance must be >= 1, got {self.tolerance}")
        if self.choices is not None and not all(self.min_steps <= c <= self.max_steps for c in self.choices):
            raise ValueError(f"choices {self.choices} must lie in [{self.min_steps}, {self.max_steps}]")

    def allowed_steps(self) -> list[int]:
        if self.choices:
            return sorted(set(self.choices))
        steps, allowed = self.min_steps, []
        while steps <= self.max_steps:
            allowed.append(steps)
            steps *= 2
        return allowed

    def lr_multiplier(self, steps: int) -> float:
        return (steps / self.reference_steps) ** LR_EXPONENTS[self.lr_scaling]

    def decide(self, current_steps: int, batch_size: float,
               estimate: Optional[NoiseScaleEstimate]) -> AccumulationDecision:
        """Steps for the next optimizer steps, given the current ones and the last mini-batch's ``batch_size``
        (global normaliser units: tokens or sequences, as ``B_simple``)."""
        per_step = batch_size / current_steps

        def keep(reason: str) -> AccumulationDecision:
            return AccumulationDecision(current_steps, self.lr_multiplier(current_steps), batch_size, False, reason)

        if estimate is None or estimate.num_updates < self.min_updates:
            have = 0 if estimate is None else estimate.num_updates
            return keep(f"waiting for {self.min_updates} noise-scale updates (have {have})")
        target = estimate.b_simple
        if batch_size / self.tolerance <= target <= batch_size * self.tolerance:
            return keep(f"B_simple={target:.4g} is within x{self.tolerance:g} of the mini-batch {batch_size:.4g}")
        allowed = self.allowed_steps()
        if math.isfinite(target):
            desired = math.log(max(target, 1e-12) / per_step)
            best = min(allowed, key=lambda steps: abs(math.log(steps) - desired))
        else:  # |G|² estimate not positive: the gradient is all noise, take the largest batch allowed
            best = allowed[-1]
        if best == current_steps:
            return keep(f"B_simple={target:.4g} asks for {target / per_step:.4g} steps; already at the bound")
        new_batch = best * per_step
        reason = (f"B_simple={target:.4g} vs mini-batch {batch_size:.4g}: grad_accum_steps {current_steps} -> {best} "
                  f"(mini-batch {new_batch:.4g}); lr x{self.lr_multiplier(best):.4g} ({self.lr_scaling} scaling "
                  f"from {self.reference_steps} steps)")
        logger.info("adaptive accumulation: %s", reason)
        return AccumulationDecision(best, self.lr_multiplier(best), new_batch, True, reason)


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


class AccumulationControl(StepHook):
    """The actor's current accumulation steps and the learning-rate schedule that goes with them; as a hook of the
    actor's engine it sets the rates before each update and reconsiders ``K`` after it, from ``monitor``'s estimate.

    Args:
        rule: when and where to move the steps.
        micro_batch_size: sequences per micro-batch on one rank (fixed).
        reference_steps: the configured steps ``K_ref`` (the learning rate was tuned there); the starting point.
        world_size: data-parallel ranks (for the effective batch metric).
        schedule: the optimizer's schedule, wrapped.
        monitor: the noise-scale measurement the rule feeds on.
    """

    def __init__(self, rule: AdaptiveAccumulation, *, micro_batch_size: int, reference_steps: int, world_size: int,
                 schedule: ScaledSchedule, monitor: NoiseScaleMonitor) -> None:
        self.rule = rule
        self.monitor = monitor
        self.micro_batch_size = micro_batch_size
        self.reference_steps = reference_steps
        self.world_size = world_size
        self.schedule = schedule
        self.steps = reference_steps
        self.last_decision: Optional[AccumulationDecision] = None

    @classmethod
    def from_config(cls, config: AdaptiveAccumulationConfig, optimizer: torch.optim.Optimizer, scheduler, *,
                    micro_batch_size: int, reference_steps: int, world_size: int, local_step_sequences: int,
                    monitor: NoiseScaleMonitor) -> "AccumulationControl":
        if not config.min_steps <= reference_steps <= config.max_steps:
            raise ValueError(f"actor.adaptive_accumulation: [{config.min_steps}, {config.max_steps}] must contain the "
                             f"configured {reference_steps} accumulation steps")
        choices = allowed_steps(config, reference_steps=reference_steps, micro_batch_size=micro_batch_size,
                                local_step_sequences=local_step_sequences)
        rule = AdaptiveAccumulation(min_steps=config.min_steps, max_steps=config.max_steps,
                                    reference_steps=reference_steps, lr_scaling=config.lr_scaling,
                                    tolerance=config.tolerance, min_updates=config.min_updates, choices=choices)
        return cls(rule, micro_batch_size=micro_batch_size, reference_steps=reference_steps, world_size=world_size,
                   schedule=ScaledSchedule(optimizer, scheduler), monitor=monitor)

    def attach(self, engine: EngineView) -> None:
        """Make ``engine`` step this control's scaled schedule and run this control as its hook."""
        engine.lr_schedule = self.schedule
        engine.hooks.append(self)

    def before_update(self, engine: EngineView) -> None:
        self.schedule.apply()

    def after_update(self, metrics: dict[str, float]) -> dict[str, float]:
        reported = self.metrics()
        if self.monitor.norms.global_batch_size is not None:
            self.update(self.monitor.norms.global_batch_size, self.monitor.estimator.latest)
        return reported

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
