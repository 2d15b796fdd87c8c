"""Where each role runs, and the start of the groups that generate: the one place that reads the rollout's
placement (``config/rollout_placement.py``; docs/concepts.md, "Where generation runs").

- engines **in the actor** (``rollout.n_gpus = 0``, ``rollout.engine_process`` → ``actor``): one
  :class:`~hybridrl.replicas.in_actor.ActorEngines` replica, weights resharded in place;
- replicas **in processes of their own**: on a standalone pool (``rollout.n_gpus = M``: ``M / t_g`` replicas, each a
  pool of its own, ``rollout0 …``) or colocated (``engine_process`` → ``own``: ``devices / t_g`` replicas, each on
  ``t_g`` of the actor's devices beside its ranks); weights published to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hybridrl.config import critic_enabled, resolved_device
from hybridrl.config.rollout_placement import colocated_replicas, replica_count, replicas_apart
from hybridrl.config.schema import TrainConfig
from hybridrl.replicas.base import Replica
from hybridrl.replicas.in_actor import ActorEngines
from hybridrl.replicas.own_processes import ProcessReplica
from hybridrl.replicas.transfer import PublishToReplicas, ReshardInPlace, WeightTransfer
from hybridrl.runtime import PoolSpec, ResourcePoolManager, WorkerGroup
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.workers.rollout_worker import RolloutWorker


def role_pools(config: TrainConfig) -> ResourcePoolManager:
    """The run's pools and which role runs where: actor (+ rollout, reference), critic and a colocated reward model on
    the ``global`` pool; a reward model with ``reward_model.n_gpus > 0`` and a rollout with ``rollout.n_gpus > 0`` on
    pools of their own. Colocated replicas in processes of their own (``rollout.engine_process=own``) are the
    ``rollout`` role of the ``global`` pool: they take a share of its bundles, on slices of ``t_g`` devices."""
    device = resolved_device(config)
    slots = concurrent_node_slots(config) if device == "cpu" else None
    specs = [PoolSpec("global", nnodes=config.trainer.nnodes, devices_per_node=config.trainer.n_gpus_per_node,
                      device=device, node_slots=slots, process_profile=ActorRolloutRefWorker.process_profile(config))]
    roles = {"actor": "global", **({"critic": "global"} if critic_enabled(config) else {})}
    if colocated_replicas(config):
        roles["rollout"] = "global"
    for role in rollout_replica_roles(config):
        specs.append(PoolSpec(role, devices_per_node=config.rollout.tensor_model_parallel_size, device=device,
                              node_slots=slots, process_profile=RolloutWorker.process_profile(config)))
        roles[role] = role
    if config.reward_model.enable:
        if config.reward_model.n_gpus > 0:
            specs.append(PoolSpec("reward_model", devices_per_node=config.reward_model.n_gpus, device=device))
        roles["reward_model"] = "reward_model" if config.reward_model.n_gpus > 0 else "global"
    return ResourcePoolManager(specs, roles)


def concurrent_node_slots(config: TrainConfig) -> Optional[int]:
    """CPU runs: the trainer's and the rollout pool's slots on the node when they compute at the same time
    (``async_training`` with η >= 1), so each worker's threads are its share of the cores. ``None`` when the pools
    take turns and each may use every core while it runs: ``sync``, and ``bounded`` with η = 0 (which must equal
    sync bit for bit, thread count included). Two single-slot pools computing at once with both cores each made
    the demo's one-step-off steps 2.6× slower than sync on 2 cores: every small op waited at an OpenMP barrier."""
    if config.async_training.staleness_bound == 0 or config.rollout.n_gpus == 0:  # η = 0: they take turns too
        return None
    return config.trainer.n_gpus_per_node + config.rollout.n_gpus


def rollout_replica_roles(config: TrainConfig) -> list[str]:
    """``rollout0 .. rollout{R-1}``: the standalone pool's replicas, each a pool of its own (``rollout.n_gpus / t_g``;
    none when colocated)."""
    return [f"rollout{index}" for index in range(replica_count(config))] if config.rollout.n_gpus else []


@dataclass
class Generators:
    """What :func:`start_generators` started: the actor group (the trainer's; its ranks publish weights or hold the
    engines), the replicas in index order, and the transfer that brings them the actor's weights."""

    actor: WorkerGroup[ActorRolloutRefWorker]
    replicas: list[Replica]
    transfer: WeightTransfer

    def shutdown(self) -> None:
        """Stop the replicas' own processes, release the transfer's notice, then stop the actor group."""
        for replica in self.replicas:
            replica.shutdown()
        self.transfer.close()
        self.actor.shutdown()


def start_generators(config: TrainConfig, pools: ResourcePoolManager, *, total_steps: int, with_reference: bool,
                     partial_rollout: bool = False) -> Generators:
    """Start the actor group (``actor_rollout_ref``) and the replicas on ``pools`` (created): the actor's own engines,
    or one ``RolloutWorker`` group per replica (``rollout0 …``). On a failure the groups already started are shut
    down before it propagates."""
    share = 1.0 / len(pools.roles_in("global"))  # colocated roles: separate processes on each bundle
    tp = config.rollout.tensor_model_parallel_size
    started: list[WorkerGroup] = []
    try:
        actor = WorkerGroup(ActorRolloutRefWorker, pools.pool_for("actor"), name="actor_rollout_ref",
                            bundle_share=share, args=(config, total_steps, with_reference),
                            tp_size=1 if replicas_apart(config) else tp,
                            sp_size=config.actor.ulysses_sequence_parallel_size)
        started.append(actor)
        if not replicas_apart(config):
            return Generators(actor, [ActorEngines(actor, config.rollout.name)], ReshardInPlace())
        for index, (pool, bundle_share) in enumerate(_replica_pools(config, pools, share)):
            started.append(WorkerGroup(RolloutWorker, pool, name=f"rollout{index}", args=(config,), tp_size=tp,
                                       bundle_share=bundle_share))
        replicas = [ProcessReplica(group) for group in started[1:]]
        return Generators(actor, list(replicas), PublishToReplicas(actor, replicas, partial_rollout))
    except BaseException:
        for group in reversed(started):
            group.shutdown()
        raise


def _replica_pools(config: TrainConfig, pools: ResourcePoolManager, share: float) -> list:
    """Each replica's devices and its share of them: a standalone replica's own pool, whole; a colocated replica's
    ``t_g`` devices of the actor's pool (ranks ``d·t_g …``), shared with the actor's ranks there."""
    if not colocated_replicas(config):
        return [(pools.pool_for(role), 1.0) for role in rollout_replica_roles(config)]
    tp, actor_pool = config.rollout.tensor_model_parallel_size, pools.pool_for("actor")
    return [(actor_pool.slice(index * tp, tp), share) for index in range(replica_count(config))]
