"""Faults the controller watches for, and the test-only fault injector.

- ``NonFiniteGuard`` counts consecutive steps whose gradients were not finite (the actor/critic skip such optimizer
  steps and leave the weights unchanged) and stops the run with a diagnosis after ``trainer.max_consecutive_nonfinite_steps``.
- ``FaultInjector`` acts on ``trainer.fault_injection`` (FOR TESTS ONLY): a real ``SIGKILL`` of a worker process or of
  the controller, or an ``OSError(ENOSPC)`` at the checkpoint write, at a chosen step.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import torch

from hybridrl.config.faults import FaultInjectionConfig
from hybridrl.protocol import Batch, Fields

logger = logging.getLogger(__name__)

# Metrics that count the optimizer steps skipped for non-finite gradients within one training step.
SKIP_COUNTERS = ("actor/skipped_step", "critic/skipped_step")
# Figures quoted in the diagnosis when present (the usual suspects, in the order a person would check them).
DIAGNOSIS_KEYS = ("actor/grad_norm", "actor/pg_loss", "actor/ppo_kl", "actor/kl_loss", "actor/entropy", "actor/lr",
                  "critic/grad_norm", "critic/vf_loss", "critic/score/mean", "critic/advantages/max",
                  "critic/advantages/min")


class NonFiniteTrainingError(RuntimeError):
    """The run produced non-finite gradients for too many steps in a row; the message says what to look at."""


class NonFiniteGuard:
    """Stops a run after ``limit`` consecutive steps with skipped (non-finite) optimizer steps; ``limit=0``: never."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bad_steps: list[int] = []

    def observe(self, step: int, metrics: Mapping[str, float], last_checkpoint: Optional[Path] = None) -> None:
        """Record step ``step``'s metrics; raise :class:`NonFiniteTrainingError` when the streak reaches the limit."""
        skipped = sum(float(metrics.get(key, 0.0)) for key in SKIP_COUNTERS)
        if skipped <= 0:
            self.bad_steps.clear()
            return
        self.bad_steps.append(step)
        logger.warning("step %d: %d optimizer step(s) skipped for non-finite gradients (%d step(s) in a row)",
                       step, int(skipped), len(self.bad_steps))
        if self.limit and len(self.bad_steps) >= self.limit:
            raise NonFiniteTrainingError(self.diagnosis(metrics, last_checkpoint))

    def diagnosis(self, metrics: Mapping[str, float], last_checkpoint: Optional[Path]) -> str:
        first, last = self.bad_steps[0], self.bad_steps[-1]
        figures = ", ".join(f"{key}={float(metrics[key]):.4g}" for key in DIAGNOSIS_KEYS if key in metrics)
        non_finite = sorted(key for key, value in metrics.items() if _is_non_finite(value))
        lines = [f"training stopped: {len(self.bad_steps)} consecutive steps ({first}-{last}) had non-finite "
                 "gradients; their optimizer steps were skipped, so the weights have not changed since step "
                 f"{first - 1} (trainer.max_consecutive_nonfinite_steps={self.limit})",
                 f"  last step's figures: {figures or 'none logged'}",
                 f"  non-finite metrics: {', '.join(non_finite) if non_finite else 'none (only the gradients)'}",
                 "  likely causes: a learning rate too high (actor.optim.lr / critic.optim.lr), float16 overflow "
                 "(model.dtype=bfloat16 or float32 instead), extreme rewards or advantages (check critic/score and "
                 "the reward function), or grad_clip disabled"]
        lines.append(f"  resume from the last checkpoint ({last_checkpoint}) after fixing the cause"
                     if last_checkpoint is not None else "  no checkpoint was written in this run")
        return "\n".join(lines)


def _is_non_finite(value: Any) -> bool:
    try:
        return not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class FaultInjector:
    """Makes the failures ``trainer.fault_injection`` asks for (each at most once per controller process).

    ``worker_killed_at`` is the ``time.monotonic()`` of the injected worker kill (for detection-time figures).
    """

    def __init__(self, config: FaultInjectionConfig) -> None:
        self.config = config
        self.worker_killed_at: Optional[float] = None

    def before_actor_update(self, step: int, groups: Mapping[str, Any]) -> None:
        """Mid-step hook (``step`` is 1-based): maybe kill a worker process, or the controller itself."""
        config = self.config
        if step == config.kill_controller_at_step and config.kill_controller_phase == "update_actor":
            _kill_this_process(f"mid-step {step}")
        if step == config.kill_worker_at_step and self.worker_killed_at is None:
            group = groups.get(config.kill_worker_role)
            if group is None:
                raise ValueError(f"trainer.fault_injection.kill_worker_role={config.kill_worker_role!r}: this run "
                                 "has no such worker group")
            pid = group.locations[config.kill_worker_rank].pid
            logger.warning("fault injection: SIGKILL to %s rank %d (pid %d) at step %d", config.kill_worker_role,
                           config.kill_worker_rank, pid, step)
            self.worker_killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)

    def corrupt_advantages(self, step: int, batch: Batch) -> None:
        """Replace ``batch``'s advantages ``[B, R]`` by NaN from ``nonfinite_advantages_from_step`` on."""
        start = self.config.nonfinite_advantages_from_step
        if start is not None and step >= start:
            batch[Fields.ADVANTAGES] = torch.full_like(batch[Fields.ADVANTAGES], float("nan"))

    def before_checkpoint_commit(self, step: int, partial_dir: Path) -> None:
        """Hook between the workers' shard writes and the controller's commit of checkpoint ``step``."""
        config = self.config
        if step == config.kill_controller_at_step and config.kill_controller_phase == "checkpoint_write":
            _kill_this_process(f"while writing checkpoint {partial_dir}")
        if step == config.checkpoint_write_error_at_step:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(partial_dir))


def _kill_this_process(where: str) -> None:
    logger.warning("fault injection: SIGKILL to the controller (pid %d) %s", os.getpid(), where)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)
