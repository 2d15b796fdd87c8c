"""How an RL run is laid out and set up: its resource pools and roles, the standalone pool's replica names, the KL
controller. Used by ``RLTrainer`` and by tools that plan a run without starting it."""

from __future__ import annotations

from typing import Optional

from hybridrl.algorithms import build_kl_controller
from hybridrl.config import critic_enabled, resolved_device
from hybridrl.config.rollout_placement import colocated_replicas, replica_count
from hybridrl.config.schema import TrainConfig
from hybridrl.runtime import PoolSpec, ResourcePoolManager
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


def kl_controller_for(config: TrainConfig, total_steps: int):
    kl = config.algorithm.kl_ctrl
    if kl.type == "fixed":
        return build_kl_controller("fixed", kl_coef=kl.kl_coef)
    if kl.type == "adaptive":
        return build_kl_controller("adaptive", init_kl_coef=kl.kl_coef, target_kl=kl.target_kl, horizon=kl.horizon)
    return build_kl_controller("scheduled", init_kl_coef=kl.kl_coef, target_kl_coef=kl.target_kl_coef,
                               total_steps=total_steps * config.data.train_batch_size * config.rollout.n)
