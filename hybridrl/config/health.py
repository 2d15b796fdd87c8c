"""Training-health alarm settings (``trainer.health``), read by ``hybridrl.trainers.health.HealthMonitor``.

Each alarm compares the mean of one metric over the last ``window`` steps with a bound; ``null`` turns an alarm off.
``validate()`` raises ``ValueError`` naming the offending ``trainer.health.<field>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config.frozen import FreezableConfig


@dataclass
class HealthConfig(FreezableConfig):
    enable: bool = True
    """Watch KL, reward and entropy every step and log a warning naming the step when one leaves its range."""
    window: int = 5
    """Steps each alarm averages over (1 = the step's own value); no alarm fires before a window is full."""
    kl_metric: str = "actor/kl_loss"
    """The KL the band applies to: ``actor/kl_loss`` (KL to the reference as a loss term, nats/token) or
    ``actor/reward_kl_penalty`` (KL in the reward)."""
    kl_min: Optional[float] = None
    """Alarm when the windowed KL falls below this (the policy is not moving); ``null`` = off."""
    kl_max: Optional[float] = None
    """Alarm when the windowed KL rises above this (the policy runs away from the reference); ``null`` = off."""
    reward_collapse_drop: Optional[float] = None
    """Alarm when the windowed mean training score (``critic/score/mean``) falls this much (absolute) below the best
    windowed mean seen so far in this process; ``null`` = off."""
    entropy_min: Optional[float] = 0.01
    """Alarm when the windowed policy entropy (``actor/entropy``, nats/token) falls below this (entropy collapse:
    sampling has become near-greedy and exploration stops); ``null`` = off."""
    stop_on_alarm: bool = False
    """Stop the run (``TrainingHealthError``) after the step on which an alarm fires; the step is logged (and
    checkpointed if one is due) first."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid ``trainer.health.<field>``."""
        if self.window < 1:
            _fail("window", self.window, "must be >= 1 step")
        if self.kl_min is not None and self.kl_max is not None and self.kl_min >= self.kl_max:
            _fail("kl_min", self.kl_min, f"must be below trainer.health.kl_max={self.kl_max}")
        for name in ("reward_collapse_drop", "entropy_min"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                _fail(name, value, "must be null (off) or > 0")


def _fail(name: str, value: object, message: str) -> None:
    raise ValueError(f"trainer.health.{name}={value!r}: {message}")
