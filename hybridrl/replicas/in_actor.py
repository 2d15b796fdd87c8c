"""Engines in the actor's processes (the hybrid engine, ``rollout.engine_process=actor``): each actor rank holds
one tensor-parallel rank of an engine, and new weights are resharded straight from the training module into it
(``hybrid_engine/sync.py``; nothing to move for an engine that samples from the actor's module, ``rollout.name=hf``).
"""

from __future__ import annotations

from typing import Optional

from hybridrl.protocol import Batch
from hybridrl.replicas.base import Pending, Publication, Replica, finished
from hybridrl.rollout import holds_own_weights
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.workers.actor_worker import NO_WEIGHT_SYNC, ActorRolloutRefWorker


class ActorEngines(Replica):
    """The actor group's engines, driven as one replica: its data-parallel leaders each generate a contiguous share
    of the prompts (``ActorRolloutRefWorker.generate_sequences``), seeded by their rank. The actor group belongs to
    the trainer: this replica neither starts nor stops it.

    Args:
        actor: the started actor group.
        rollout_name: ``rollout.name`` (whether the engine holds weights of its own).
    """

    def __init__(self, actor: WorkerGroup[ActorRolloutRefWorker], rollout_name: str) -> None:
        self.actor, self.name = actor, actor.name
        self.holds_own_weights = holds_own_weights(rollout_name)

    @property
    def is_stopped(self) -> bool:
        return self.actor.is_stopped

    def generate(self, prompts: Batch, params: SamplingParams, policy_version: int) -> Pending:
        # the engines refuse to generate with weights older than the actor's (``engine_weights.require_current``)
        return self.actor.call_async(ActorRolloutRefWorker.generate_sequences, prompts, params)

    def update_weights(self, publication: Optional[Publication], policy_version: int) -> Pending:
        if not self.holds_own_weights:
            return finished(dict(NO_WEIGHT_SYNC))
        return self.actor.call_async(ActorRolloutRefWorker.sync_rollout_weights, policy_version)

    def relabel_weights(self, policy_version: int) -> Optional[Pending]:
        if self.holds_own_weights:
            self.actor.call(ActorRolloutRefWorker.relabel_rollout_weights, policy_version)
        return None
