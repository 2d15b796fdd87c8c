"""Who generates, and how new weights reach them: the controller's one view of colocated and standalone rollout.

- **colocated** (``rollout.n_gpus = 0``, the hybrid engine): the actor's group generates; a sync is the actor group's
  own ``sync_rollout_weights`` (the resharder; nothing for ``rollout.name=hf``).
- **standalone** (``rollout.n_gpus = M``, split placement): a ``RolloutWorker`` group of ``M`` devices generates; a
  sync is two calls in order — every trainer rank publishes its rows (``ActorRolloutRefWorker.publish_weights``),
  then every rollout rank loads them, checked against the trainer ranks' summed fingerprints. Each generation names
  the actor version it expects the engines to hold, so a skipped sync is an error, not a silent off-policy step.
"""

from __future__ import annotations

from typing import Optional

import torch

from hybridrl.protocol import Batch
from hybridrl.rollout import holds_own_weights
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.workers.actor_worker import NO_WEIGHT_SYNC, ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker


class Generation:
    """The generating group and the weight sync into it (see the module docstring)."""

    def __init__(self, actor: WorkerGroup[ActorRolloutRefWorker], rollout_name: str,
                 pool: Optional[WorkerGroup[RolloutWorker]] = None) -> None:
        self.actor, self.pool, self.rollout_name = actor, pool, rollout_name
        self.layout = actor.call(ActorRolloutRefWorker.published_layout) if pool is not None else None
        self.version: Optional[int] = None  # the actor version the pool holds (standalone); None: as loaded

    @property
    def standalone(self) -> bool:
        return self.pool is not None

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``B`` prompts → ``B·n`` rows from whichever group generates."""
        if self.pool is None:
            return self.actor.call(ActorRolloutRefWorker.generate_sequences, prompts, params)
        return self.pool.call(RolloutWorker.generate_sequences, prompts, params, self.version)

    def sync_weights(self) -> dict[str, float]:
        """Bring the generating engines to the actor's current weights; the sync's metrics."""
        if self.pool is None:
            if not holds_own_weights(self.rollout_name):
                return dict(NO_WEIGHT_SYNC)
            return self.actor.call(ActorRolloutRefWorker.sync_rollout_weights)
        published = self.actor.call(ActorRolloutRefWorker.publish_weights)
        versions = {version for version, _ in published}
        if len(versions) != 1:
            raise RuntimeError(f"the trainer's ranks disagree on the weight version: {sorted(versions)}")
        fingerprints = [expected for _, expected in published]
        expected = None if fingerprints[0] is None else torch.stack(fingerprints).sum(0)
        version = versions.pop()
        metrics = self.pool.call(RolloutWorker.load_published_weights, self.layout, expected, version)
        self.version = version
        return metrics
