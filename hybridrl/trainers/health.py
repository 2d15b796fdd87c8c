"""Training-health alarms: KL outside a band, reward collapse, entropy collapse (``trainer.health``).

The trainer hands :meth:`HealthMonitor.observe` each step's metrics. Every alarm looks at the mean of one metric over
the last ``window`` steps (non-finite values and steps without the metric are skipped) and fires **once when the
condition starts** — a warning naming the step, the value and the bound — then re-arms when the metric is back in
range. With ``stop_on_alarm`` the trainer calls :meth:`HealthMonitor.raise_if_stopping` after logging (and any due
checkpoint) and the run ends with :class:`TrainingHealthError`.

The windows live in this process only: after a resume they fill again before any alarm can fire.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional

from hybridrl.config.health import HealthConfig

logger = logging.getLogger(__name__)

REWARD_METRIC = "critic/score/mean"
ENTROPY_METRIC = "actor/entropy"


class TrainingHealthError(RuntimeError):
    """The run was stopped by a training-health alarm (``trainer.health.stop_on_alarm``)."""


@dataclass(frozen=True)
class Alarm:
    """One alarm that fired: ``kind`` is ``kl_high``, ``kl_low``, ``reward_collapse`` or ``entropy_collapse``."""

    kind: str
    step: int
    value: float
    message: str


class HealthMonitor:
    """Watches the step metrics named in :class:`~hybridrl.config.health.HealthConfig` for the three alarms."""

    def __init__(self, config: HealthConfig) -> None:
        config.validate()
        self.config = config
        self.windows: dict[str, deque[float]] = {}
        self.best_reward = -math.inf
        self.active: set[str] = set()
        self.fired: list[Alarm] = []
        self._pending: list[Alarm] = []

    def observe(self, step: int, metrics: Mapping[str, float]) -> dict[str, float]:
        """Update the windows with ``metrics`` of ``step``, log newly fired alarms; returns ``{"health/alarms": n}``."""
        if not self.config.enable:
            return {}
        conditions = self._conditions(metrics)
        alarms = []
        for kind, (bad, value, message) in conditions.items():
            if bad and kind not in self.active:
                alarms.append(Alarm(kind, step, value, f"step {step}: {message}"))
            (self.active.add if bad else self.active.discard)(kind)
        for alarm in alarms:
            logger.warning("training health: %s", alarm.message)
        self.fired += alarms
        self._pending += alarms
        return {"health/alarms": float(len(alarms))}

    def raise_if_stopping(self) -> None:
        """With ``stop_on_alarm``, raise :class:`TrainingHealthError` if an alarm fired since the last call."""
        pending, self._pending = self._pending, []
        if pending and self.config.stop_on_alarm:
            reasons = "; ".join(alarm.message for alarm in pending)
            raise TrainingHealthError(f"training stopped by trainer.health.stop_on_alarm: {reasons}")

    # ------------------------------------------------------------------ the checks
    def _conditions(self, metrics: Mapping[str, float]) -> dict[str, tuple[bool, float, str]]:
        """Per alarm kind whose window is full: (in alarm?, windowed value, message)."""
        config, conditions = self.config, {}
        kl = self._windowed(config.kl_metric, metrics)
        if kl is not None and config.kl_max is not None:
            conditions["kl_high"] = (kl > config.kl_max, kl, f"{config.kl_metric} = {kl:.4g} (mean of the last "
                                     f"{config.window} steps) is above trainer.health.kl_max={config.kl_max:g}")
        if kl is not None and config.kl_min is not None:
            conditions["kl_low"] = (kl < config.kl_min, kl, f"{config.kl_metric} = {kl:.4g} (mean of the last "
                                    f"{config.window} steps) is below trainer.health.kl_min={config.kl_min:g}")
        reward = self._windowed(REWARD_METRIC, metrics)
        if reward is not None and config.reward_collapse_drop is not None:
            self.best_reward = max(self.best_reward, reward)
            drop = self.best_reward - reward
            conditions["reward_collapse"] = (
                drop > config.reward_collapse_drop, reward,
                f"reward collapse: {REWARD_METRIC} = {reward:.4g} (mean of the last {config.window} steps) is "
                f"{drop:.4g} below its best {self.best_reward:.4g} (trainer.health.reward_collapse_drop="
                f"{config.reward_collapse_drop:g})")
        entropy = self._windowed(ENTROPY_METRIC, metrics)
        if entropy is not None and config.entropy_min is not None:
            conditions["entropy_collapse"] = (
                entropy < config.entropy_min, entropy,
                f"entropy collapse: {ENTROPY_METRIC} = {entropy:.4g} nats/token (mean of the last {config.window} "
                f"steps) is below trainer.health.entropy_min={config.entropy_min:g}")
        return conditions

    def _windowed(self, name: str, metrics: Mapping[str, float]) -> Optional[float]:
        """Append this step's value of ``name``; the window's mean once it holds ``window`` values. ``None`` when the
        step has no finite value of it (e.g. no actor update during critic warm-up): nothing is judged then."""
        window = self.windows.setdefault(name, deque(maxlen=self.config.window))
        value = metrics.get(name)
        if value is None or not math.isfinite(value):
            return None
        window.append(float(value))
        return sum(window) / len(window) if len(window) == self.config.window else None
