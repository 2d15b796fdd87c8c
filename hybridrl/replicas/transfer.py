"""How the trainer's new weights leave it for the replicas: the first half of a weight sync (the second is each
replica's :meth:`~hybridrl.replicas.base.Replica.update_weights`).

- :class:`ReshardInPlace` — engines in the actor's processes: nothing leaves the actor; each replica reshards from
  the training module at its load (``hybrid_engine/sync.py``).
- :class:`PublishToReplicas` — replicas in processes of their own: every trainer rank publishes its rows
  (``rollout.weight_transfer``: a shared arena, Ray's object store, or a process group per replica, opened here),
  with fingerprints the loads are checked against. With partial rollout a notice tells generations in flight that a
  new version is there to take.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Optional, Sequence

import torch

from hybridrl.hybrid_engine.publish import Notice, PublicationNotice
from hybridrl.replicas.base import Publication
from hybridrl.replicas.own_processes import ProcessReplica
from hybridrl.runtime import WorkerGroup
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker


class WeightTransfer(ABC):
    """The sending half of a weight sync (see the module docstring)."""

    publish_seconds: Optional[float] = None  # the last publish, as the controller waited for it (None: none made)

    @abstractmethod
    def publish(self, replicas: Sequence[int], policy_version: int) -> Optional[Publication]:
        """Make the actor's current weights, as those of ``policy_version``, readable by the live ``replicas``
        (their indices); what each replica's load is then given."""

    def close(self) -> None:
        """Release what the transfer holds beyond the groups (the partial-rollout notice)."""


class ReshardInPlace(WeightTransfer):
    """Engines in the actor's processes: each load reshards from the training module (nothing is published)."""

    def publish(self, replicas: Sequence[int], policy_version: int) -> None:
        return None


class PublishToReplicas(WeightTransfer):
    """The actor group publishes; replicas in processes of their own load (see the module docstring).

    Args:
        actor: the started actor group (its ranks publish).
        replicas: the replicas, in index order (a collective channel is opened to each).
        partial_rollout: post a notice for generations in flight (``async_training.partial_rollout``).
    """

    def __init__(self, actor: WorkerGroup[ActorRolloutRefWorker], replicas: Sequence[ProcessReplica],
                 partial_rollout: bool = False) -> None:
        self.actor = actor
        self.layout = actor.call(ActorRolloutRefWorker.published_layout)
        if self.layout.transport == "collective":
            self._open_channels(replicas)
        self.notice: Optional[PublicationNotice] = None
        if partial_rollout:
            self.notice = PublicationNotice.create()
            for replica in replicas:
                replica.group.call(RolloutWorker.follow_publications, self.layout, self.notice.path)

    def _open_channels(self, replicas: Sequence[ProcessReplica]) -> None:
        """A process group from the trainer's ranks to each replica's ranks, joined by both sides at once (the
        trainer's rank 0 hosts each rendezvous)."""
        for index, replica in enumerate(replicas):
            address = self.actor.call(ActorRolloutRefWorker.host_weight_channel, index, replica.group.world_size)
            joins = [self.actor.call_async(ActorRolloutRefWorker.join_weight_channel, index, address),
                     replica.group.call_async(RolloutWorker.join_weight_channel, address)]
            for join in joins:
                join.result()

    def publish(self, replicas: Sequence[int], policy_version: int) -> Publication:
        """Every trainer rank writes its rows (the ``collective`` transport posts its sends to ``replicas`` and
        returns; their loads receive them); the fingerprints are summed over the trainer's ranks."""
        started = time.perf_counter()
        published = self.actor.call(ActorRolloutRefWorker.publish_weights, list(replicas), policy_version)
        self.publish_seconds = time.perf_counter() - started
        fingerprints = [publication.expected for publication in published]
        expected = None if fingerprints[0] is None else torch.stack(fingerprints).sum(0)
        rows = [reference for publication in published for reference in publication.rows]  # trainer rank order
        if self.notice is not None:  # a generation in flight may take these weights now (partial rollout)
            self.notice.post(Notice(policy_version, expected))
        return Publication(self.layout, expected, rows)

    def close(self) -> None:
        if self.notice is not None:
            self.notice.remove()
