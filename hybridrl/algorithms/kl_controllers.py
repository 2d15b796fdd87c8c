"""KL-coefficient controllers for KL-in-reward PPO (``algorithm.kl_ctrl``).

Every controller exposes ``.value`` (the current coefficient), ``.update(current_kl, n_steps)`` (called once per
training step with the measured KL and the step's size in the same unit as ``horizon`` / ``total_steps`` — verl
passes the batch size in samples), and ``state_dict()`` / ``load_state_dict()`` holding exactly the mutable state,
so a resumed run continues with the same coefficients. Build one from config with :func:`build_kl_controller`.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "KL_CONTROLLER_KINDS",
    "FixedKLController",
    "AdaptiveKLController",
    "ScheduledKLController",
    "build_kl_controller",
]


def _check_kind(state: dict[str, Any], kind: str) -> None:
    if state.get("kind") != kind:
        raise ValueError(f"cannot load a {state.get('kind')!r} KL controller state into a {kind!r} controller")


class FixedKLController:
    """A constant coefficient ``kl_coef``; ``update`` does nothing."""

    kind = "fixed"

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (the coefficient is fixed)."""

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, self.kind)
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 ("Fine-Tuning Language Models from Human Preferences").

    Each update: ``error = clip(current_kl / target_kl - 1, -0.2, 0.2)`` and
    ``value *= 1 + error * n_steps / horizon`` — the coefficient grows while the KL is above target and shrinks
    while below, by at most 20 % per ``horizon`` units of ``n_steps``.
    """

    kind = "adaptive"
    MAX_PROPORTIONAL_ERROR = 0.2

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl} and {horizon}")
        self.value = float(init_kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient toward keeping ``current_kl`` at ``target_kl``."""
        limit = self.MAX_PROPORTIONAL_ERROR
        error = min(max(float(current_kl) / self.target_kl - 1.0, -limit), limit)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, self.kind)
        self.value = float(state["value"])


class ScheduledKLController:
    """An open-loop schedule of the coefficient over training progress ``p = min(consumed / total_steps, 1)``.

    ``consumed`` is the sum of every ``n_steps`` passed to :meth:`update` (``current_kl`` is ignored). With
    ``c0 = init_kl_coef``, ``c1 = ramp_kl_coef``, ``c2 = target_kl_coef``, ``p1 = warmup_end``, ``p2 = ramp_end``:

    - warm-up oscillation, ``0 <= p < p1``:  ``c0 * (1 + a * sin(2 pi k p / p1))`` with
      ``a = oscillation_amplitude`` (in ``[0, 1)``, so the value stays positive) and ``k = oscillation_cycles``
      (whole cycles, so the phase ends back at ``c0``);
    - square-root ramp, ``p1 <= p < p2``:   ``c0 + (c1 - c0) * sqrt((p - p1) / (p2 - p1))`` — fast at first;
    - quadratic approach, ``p2 <= p <= 1``: ``c2 + (c1 - c2) * (1 - (p - p2) / (1 - p2)) ** 2`` — lands on ``c2``
      at ``p = 1`` with zero slope, and stays there afterwards.

    The schedule is continuous; empty phases (``p1 = 0``, ``p1 = p2`` or ``p2 = 1``) are skipped (with no ramp,
    the approach starts from ``c0``). ``ramp_kl_coef`` defaults to ``init_kl_coef``.
    """

    kind = "scheduled"

    def __init__(
        self,
        init_kl_coef: float,
        target_kl_coef: float,
        total_steps: float,
        ramp_kl_coef: float | None = None,
        warmup_end: float = 0.1,
        ramp_end: float = 0.5,
        oscillation_amplitude: float = 0.5,
        oscillation_cycles: int = 2,
    ) -> None:
        if total_steps <= 0:
            raise ValueError(f"total_steps must be positive, got {total_steps}")
        if not 0.0 <= warmup_end <= ramp_end <= 1.0:
            raise ValueError(f"need 0 <= warmup_end <= ramp_end <= 1, got {warmup_end} and {ramp_end}")
        if not 0.0 <= oscillation_amplitude < 1.0:
            raise ValueError(f"oscillation_amplitude must be in [0, 1), got {oscillation_amplitude}")
        if int(oscillation_cycles) != oscillation_cycles or oscillation_cycles < 0:
            raise ValueError(f"oscillation_cycles must be a non-negative integer, got {oscillation_cycles}")
        self.init_kl_coef = float(init_kl_coef)
        self.ramp_kl_coef = float(init_kl_coef if ramp_kl_coef is None else ramp_kl_coef)
        self.target_kl_coef = float(target_kl_coef)
        self.total_steps = float(total_steps)
        self.warmup_end, self.ramp_end = float(warmup_end), float(ramp_end)
        self.oscillation_amplitude = float(oscillation_amplitude)
        self.oscillation_cycles = int(oscillation_cycles)
        self.consumed_steps = 0.0

    @property
    def progress(self) -> float:
        """Training progress in ``[0, 1]``."""
        return min(self.consumed_steps / self.total_steps, 1.0)

    @property
    def value(self) -> float:
        """The coefficient at the current progress."""
        return self.coef_at(self.progress)

    def coef_at(self, progress: float) -> float:
        """The scheduled coefficient at ``progress`` (clamped into ``[0, 1]``); a pure function of the config."""
        p = min(max(float(progress), 0.0), 1.0)
        c0, c1, c2 = self.init_kl_coef, self.ramp_kl_coef, self.target_kl_coef
        p1, p2 = self.warmup_end, self.ramp_end
        if p < p1:
            phase = 2.0 * math.pi * self.oscillation_cycles * p / p1
            return c0 * (1.0 + self.oscillation_amplitude * math.sin(phase))
        if p < p2:
            return c0 + (c1 - c0) * math.sqrt((p - p1) / (p2 - p1))
        start = c1 if p2 > p1 else c0  # where the ramp ended (c0 when there was no ramp), for continuity
        if p2 >= 1.0:
            return start
        return c2 + (start - c2) * (1.0 - (p - p2) / (1.0 - p2)) ** 2

    def update(self, current_kl: float, n_steps: int) -> None:
        """Advance the schedule by ``n_steps`` (the measured KL does not feed back)."""
        self.consumed_steps += float(n_steps)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "consumed_steps": self.consumed_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_kind(state, self.kind)
        self.consumed_steps = float(state["consumed_steps"])


KLController = FixedKLController | AdaptiveKLController | ScheduledKLController

_CONTROLLERS: dict[str, type] = {
    "fixed": FixedKLController,
    "adaptive": AdaptiveKLController,
    "scheduled": ScheduledKLController,
}
KL_CONTROLLER_KINDS: tuple[str, ...] = tuple(_CONTROLLERS)


def build_kl_controller(kind: str, **kwargs: Any) -> KLController:
    """Build the controller ``kind`` (``fixed`` / ``adaptive`` / ``scheduled``) from its constructor arguments.

    Raises:
        ValueError: for an unknown ``kind`` (listing the valid ones).
        TypeError: for arguments the chosen controller does not take.
    """
    if kind not in _CONTROLLERS:
        raise ValueError(f"unknown KL controller kind {kind!r}; valid kinds: {', '.join(KL_CONTROLLER_KINDS)}")
    return _CONTROLLERS[kind](**kwargs)
