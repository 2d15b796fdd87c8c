"""A worker the secrets test starts in a Ray actor (importable there through ``trainer.ray.worker_env``)."""

from __future__ import annotations

import os
from typing import Optional

from hybridrl.runtime import Worker, one_to_all


class EnvWorker(Worker):
    @one_to_all
    def getenv(self, name: str) -> Optional[str]:
        return os.environ.get(name)
