"""The rollout replicas as the single controller drives them: one :class:`Replica` type for every placement, the
:class:`WeightTransfer` that brings them the trainer's weights, and the one place that reads the placement
(:func:`start_generators`, :func:`role_pools`). Above ``workers/`` and ``runtime/``, below ``trainers/``."""

from hybridrl.replicas.base import Publication, Replica
from hybridrl.replicas.placement import (Generators, concurrent_node_slots, role_pools, rollout_replica_roles,
                                         start_generators)
from hybridrl.replicas.transfer import WeightTransfer

__all__ = ["Generators", "Publication", "Replica", "WeightTransfer", "concurrent_node_slots", "role_pools",
           "rollout_replica_roles", "start_generators"]
