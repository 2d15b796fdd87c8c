"""Automatic restart after a lost worker (``trainer.max_restarts``).

When a worker process dies (crash, OOM kill, ``SIGKILL``, lost node) or hangs past its call timeout, the worker
group raises ``WorkerDiedError`` / ``WorkerTimeoutError`` naming role and rank. ``Supervisor.run`` then lets the
trainer stop every worker group, start them again and resume from the run's last checkpoint — the same code path as
a resume after a crash, so the result equals an uninterrupted run (bit for bit on CPU). Exceptions raised by worker
code are not retried: they would recur.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from hybridrl.runtime.errors import WorkerDiedError, WorkerError, WorkerTimeoutError

logger = logging.getLogger(__name__)

RESTARTABLE = (WorkerDiedError, WorkerTimeoutError)


@dataclass
class RestartRecord:
    """One restart: what failed, when (``time.monotonic()``), and how long the restart and resume took."""

    error: str
    role: str
    rank: Optional[int]
    failed_after_step: int
    failed_at: float
    restart_s: Optional[float] = None
    resumed_from: Optional[Path] = None
    resumed_step: Optional[int] = None


class Supervisor:
    """Runs a training attempt, restarting it after a lost worker up to ``max_restarts`` times."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.records: list[RestartRecord] = []

    @property
    def restarting(self) -> bool:
        """True while an attempt after a failure is starting (until :meth:`resumed`)."""
        return bool(self.records) and self.records[-1].restart_s is None

    def run(self, attempt: Callable[[], None], current_step: Callable[[], int]) -> None:
        """Call ``attempt()`` until it returns; after a lost worker, call it again (it must resume by itself)."""
        while True:
            try:
                attempt()
                return
            except RESTARTABLE as error:
                if len(self.records) >= self.max_restarts:
                    if self.max_restarts:
                        logger.error("giving up after %d restart(s) (trainer.max_restarts)", len(self.records))
                    raise
                self._note_failure(error, current_step())

    def _note_failure(self, error: WorkerError, step: int) -> None:
        self.records.append(RestartRecord(error=str(error).splitlines()[0], role=error.role, rank=error.rank,
                                          failed_after_step=step, failed_at=time.monotonic()))
        logger.error("%s — restarting the worker groups and resuming from the last checkpoint (restart %d of %d)",
                     self.records[-1].error, len(self.records), self.max_restarts)

    def resumed(self, checkpoint: Optional[Path], step: int) -> None:
        """The trainer calls this once an attempt has restored its state; closes the current restart's record."""
        if not self.restarting:
            return
        record = self.records[-1]
        record.restart_s = time.monotonic() - record.failed_at
        record.resumed_from, record.resumed_step = checkpoint, step
        logger.warning("restarted and resumed from %s at step %d in %.1f s (failure after step %d)",
                       checkpoint or "the start", step, record.restart_s, record.failed_after_step)
