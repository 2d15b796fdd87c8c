"""A replica in processes of its own: a ``RolloutWorker`` group of ``t_g`` ranks, on a pool of its own devices
(``rollout.n_gpus = M``) or on ``t_g`` of the actor's devices beside its ranks (``rollout.engine_process=own``).
Its own process group: a replica that dies takes no other down. Weights arrive as the trainer publishes them
(:mod:`hybridrl.replicas.transfer`), checked against the trainer's fingerprints; each load records the trainer's
``policy_version``, so a generation asked for at another version is refused.
"""

from __future__ import annotations

from typing import Optional

from hybridrl.protocol import Batch
from hybridrl.replicas.base import Pending, Publication, Replica
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import WorkerGroup
from hybridrl.workers.rollout_worker import RolloutWorker


class ProcessReplica(Replica):
    """A started ``RolloutWorker`` group driven as one replica; stopping the replica stops the group."""

    def __init__(self, group: WorkerGroup[RolloutWorker]) -> None:
        self.group, self.name = group, group.name

    @property
    def is_stopped(self) -> bool:
        return self.group.is_stopped

    def generate(self, prompts: Batch, params: SamplingParams, policy_version: int) -> Pending:
        return self.group.call_async(RolloutWorker.generate_sequences, prompts, params, policy_version)

    def update_weights(self, publication: Optional[Publication], policy_version: int) -> Pending:
        if publication is None:
            raise ValueError(f"replica {self.name!r} runs in processes of its own: it loads published weights only")
        return self.group.call_async(RolloutWorker.load_published_weights, publication.layout, publication.expected,
                                     policy_version, publication.rows)

    def relabel_weights(self, policy_version: int) -> Optional[Pending]:
        return self.group.call_async(RolloutWorker.relabel_weights, policy_version)

    def busy_seconds(self) -> Optional[float]:
        return sum(self.group.pop_worker_seconds().values())

    def groups(self) -> list[WorkerGroup]:
        return [self.group]
