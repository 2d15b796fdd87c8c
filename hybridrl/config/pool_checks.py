"""Checks of replicas in processes of their own — a standalone rollout pool (``rollout.n_gpus > 0``) or colocated
ones (``rollout.engine_process=own``): the pool's size and engine — and of ``rollout.weight_transfer``, the one key
that chooses how weights reach the engines wherever they run."""

from __future__ import annotations

from hybridrl.config.checks import _choice, _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.rollout_placement import check_engine_process, generates_with_actor_module, replicas_apart
from hybridrl.config.rollout_schema import IN_PLACE_TRANSFERS, PUBLISHED_TRANSFERS, WEIGHT_TRANSFERS
from hybridrl.config.schema import TrainConfig


def check_rollout_pool(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.n_gpus``: a standalone pool of vLLM replicas, whole ones, and a weight transport that reaches it."""
    pool, tp, key = config.rollout.n_gpus, config.rollout.tensor_model_parallel_size, "rollout.n_gpus"
    _require(error, key, pool, pool >= 0, "must be >= 0 (0: generate on the actor's devices; M: a pool of M)")
    check_engine_process(config, error)
    if pool > 0 and generates_with_actor_module(config.rollout.name):
        error.add(key, pool, f"rollout.name={config.rollout.name} generates with the actor's own module; a "
                             "standalone pool needs rollout.name=vllm (an engine with weights of its own)")
    if pool > 0 and pool % tp:
        error.add(key, pool, f"must be a multiple of rollout.tensor_model_parallel_size={tp} (whole replicas)")
    if pool < 0 or not replicas_apart(config):
        if config.rollout.weight_delta:
            error.add("rollout.weight_delta", True, "applies to replicas in processes of their own (rollout.n_gpus > "
                      "0 or rollout.engine_process=own) reached through rollout.weight_transfer=object_store or "
                      "collective; an "
                      "engine in the actor's processes is resharded in place")
        return
    transport = config.rollout.weight_transfer
    if transport == "shared_memory" and config.trainer.nnodes > 1:
        error.add("rollout.weight_transfer", transport, "a host-shared copy reaches replicas on the trainer's "
                  f"host only; trainer.nnodes={config.trainer.nnodes}: use object_store (or auto)")
    timeout = config.rollout.weight_transfer_timeout_s
    _require(error, "rollout.weight_transfer_timeout_s", timeout, timeout > 0, "must be > 0 (seconds)")
    resolved = resolved_weight_transport(config)
    check_weight_delta(config, resolved, error)
    if resolved != "shared_memory" and config.async_training.partial_rollout:
        error.add("async_training.partial_rollout", True, "new weights reach a generation in flight through the "
                  f"host's shared memory, which the {resolved} weight transport does not use; turn partial "
                  "rollout off, or keep the pool on the trainer's host (rollout.weight_transfer=shared_memory)")


def check_weight_delta(config: TrainConfig, transport: str, error: ConfigError) -> None:
    """``rollout.weight_delta``: deltas travel where bytes travel (the object store, a collective)."""
    every = config.rollout.weight_delta_full_every
    _require(error, "rollout.weight_delta_full_every", every, every >= 1, "must be >= 1 (1: every sync whole)")
    if config.rollout.weight_delta and transport == "shared_memory":
        error.add("rollout.weight_delta", True, "needs rollout.weight_transfer=object_store or collective: with "
                  "shared_memory the replicas read the trainer's host-shared copy in place, no bytes travel to save")


def check_weight_transfer(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.weight_transfer``: a known one, and one this placement can use."""
    transfer, key = config.rollout.weight_transfer, "rollout.weight_transfer"
    _choice(error, key, transfer, WEIGHT_TRANSFERS)
    if transfer not in WEIGHT_TRANSFERS or config.rollout.n_gpus < 0:
        return
    if replicas_apart(config):
        if transfer not in PUBLISHED_TRANSFERS:
            error.add(key, transfer, "reshards into engines in the actor's processes; replicas in processes of their "
                      "own (rollout.n_gpus > 0 or rollout.engine_process=own) take one of "
                      + ", ".join(PUBLISHED_TRANSFERS))
        return
    if transfer not in IN_PLACE_TRANSFERS:
        error.add(key, transfer, "reaches replicas in processes of their own (rollout.n_gpus > 0 or "
                  "rollout.engine_process=own); engines in the actor's processes are resharded in place: use one of "
                  + ", ".join(IN_PLACE_TRANSFERS))
    if transfer == "shared_memory" and config.trainer.device != "cpu":
        error.add(key, transfer, "moves host tensors through /dev/shm into engines in the actor's processes: it needs "
                  f"trainer.device=cpu (here {config.trainer.device}; on a GPU use plan, NCCL point-to-point)")
    elif transfer == "shared_memory" and config.trainer.nnodes > 1:
        error.add(key, transfer, f"needs every rank on one host; trainer.nnodes={config.trainer.nnodes}: use plan")
    if transfer == "gather" and config.rollout.tensor_model_parallel_size > 1:
        error.add(key, transfer, "delivers full tensors: it needs rollout.tensor_model_parallel_size=1 (use plan)")


def reshard_method(config: TrainConfig) -> str:
    """``rollout.weight_transfer`` as the resharder into engines in the actor's processes names it
    (``hybrid_engine.sync.METHODS``: ``shared_memory`` is its ``shared``)."""
    transfer = config.rollout.weight_transfer
    return "shared" if transfer == "shared_memory" else transfer


def resolved_weight_transport(config: TrainConfig) -> str:
    """``rollout.weight_transfer`` to replicas in processes of their own, with ``auto`` resolved: ``shared_memory``
    for a local Ray instance on one node (the pool is then on the trainer's host by construction), else
    ``object_store``."""
    transport = config.rollout.weight_transfer
    if transport != "auto":
        return transport
    one_host = config.trainer.nnodes == 1 and config.trainer.ray.address == "local"
    return "shared_memory" if one_host else "object_store"
