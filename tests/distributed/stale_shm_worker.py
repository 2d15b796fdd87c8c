"""The trainer's actor worker, started where a killed run left vLLM's CPU shared-memory segments behind (a module of
its own: importing the actor worker takes seconds, and the light sample workers must not pay it)."""

from __future__ import annotations

import os
from pathlib import Path

from hybridrl.workers.actor_worker import ActorRolloutRefWorker


class ActorWorkerAfterAKilledRun(ActorRolloutRefWorker):
    """The actor worker, started where a killed run that had this group's port left its vLLM CPU shared-memory
    segments behind (the OS hands ports out again; CI met this as ``create shm in SHMManager failed. errno: 17``)."""

    def __init__(self, *args):
        for rank in (0, 1):  # the names vLLM's TP group of ranks 0-1 creates, one per rank
            stale = Path("/dev/shm") / f"{os.environ['MASTER_PORT']}-tp:0-[0-1]-cpushm_{rank}"
            stale.write_bytes(b"left by a killed run")
        super().__init__(*args)
