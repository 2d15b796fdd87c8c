"""Fault-injection settings (``trainer.fault_injection``): FOR TESTS ONLY.

The reliability tests use these to make a failure happen at a chosen point of a real run — a real ``SIGKILL`` of a
worker or of the controller, or an ``OSError(ENOSPC)`` at the checkpoint write — so that restart, resume and
checkpoint integrity can be checked deterministically. Every field defaults to "off"; never set them in a real run.
``hybridrl.trainers.faults`` acts on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config.frozen import FreezableConfig

KILL_PHASES = ("update_actor", "checkpoint_write")


@dataclass
class FaultInjectionConfig(FreezableConfig):
    kill_worker_at_step: Optional[int] = None
    """(Testing) During this step (1-based), just before the actor update, the controller sends ``SIGKILL`` to the
    worker process ``kill_worker_role`` / ``kill_worker_rank``. Fires once per controller process."""
    kill_worker_role: str = "actor_rollout_ref"
    """(Testing) Worker group whose process ``kill_worker_at_step`` kills: ``actor_rollout_ref`` | ``critic`` |
    ``rollout<k>`` (replica ``k`` of a standalone rollout pool)."""
    kill_worker_rank: int = 0
    """(Testing) Rank of the worker process ``kill_worker_at_step`` kills."""
    kill_controller_at_step: Optional[int] = None
    """(Testing) The controller sends ``SIGKILL`` to itself during this step (1-based), at ``kill_controller_phase``:
    no clean-up runs, exactly as when the job is killed from outside."""
    kill_controller_phase: str = "update_actor"
    """(Testing) Where ``kill_controller_at_step`` kills: ``update_actor`` (mid-step, before the actor update) |
    ``checkpoint_write`` (the workers' shards of that step's checkpoint are on disk, the commit has not happened)."""
    checkpoint_write_error_at_step: Optional[int] = None
    """(Testing) Simulate a full disk: the checkpoint of this step fails with ``OSError(ENOSPC)`` raised where the
    controller writes its trainer state into the half-written checkpoint (after the workers' shards)."""
    rollout_delay_s: float = 0.0
    """(Testing) Each generation call of a standalone rollout replica first sleeps a random time in
    ``[0, rollout_delay_s]`` (drawn from the call's own seed): random generation delays for the async contract."""
    rollout_step_delay_s: float = 0.0
    """(Testing) With ``async_training.partial_rollout``, a standalone replica sleeps this long after each engine
    step: slow generations, so that new weights arrive while one is in flight."""
    nonfinite_advantages_from_step: Optional[int] = None
    """(Testing) From this step on, the controller replaces the advantages by NaN, so every optimizer step of the actor
    sees non-finite gradients (and skips them) — for ``trainer.max_consecutive_nonfinite_steps``."""

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid ``trainer.fault_injection.<field>``."""
        for name in ("kill_worker_at_step", "kill_controller_at_step", "checkpoint_write_error_at_step",
                     "nonfinite_advantages_from_step"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"trainer.fault_injection.{name}={value!r}: must be null or a step >= 1")
        for name in ("rollout_delay_s", "rollout_step_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.fault_injection.{name}={getattr(self, name)!r}: must be >= 0")
        role = self.kill_worker_role
        if role not in ("actor_rollout_ref", "critic") and not (role.startswith("rollout") and role[7:].isdigit()):
            raise ValueError(f"trainer.fault_injection.kill_worker_role={role!r}: must be actor_rollout_ref, "
                             "critic or rollout<k> (replica k of a standalone rollout pool)")
        if self.kill_worker_rank < 0:
            raise ValueError(f"trainer.fault_injection.kill_worker_rank={self.kill_worker_rank!r}: must be >= 0")
        if self.kill_controller_phase not in KILL_PHASES:
            raise ValueError(f"trainer.fault_injection.kill_controller_phase={self.kill_controller_phase!r}: must be "
                             f"one of {', '.join(KILL_PHASES)}")
