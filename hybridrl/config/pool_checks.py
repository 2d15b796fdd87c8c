"""Checks of replicas in processes of their own — a standalone rollout pool (``rollout.n_gpus > 0``) or colocated
ones (``rollout.engine_process=own``): the pool's size and engine, and the weight transport that reaches them."""

from __future__ import annotations

from hybridrl.config.checks import _choice, _require
from hybridrl.config.errors import ConfigError
from hybridrl.config.rollout_placement import check_engine_process, generates_with_actor_module, replicas_apart
from hybridrl.config.rollout_schema import WEIGHT_TRANSPORTS
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
                      "0 or rollout.engine_process=own) reached through rollout.weight_transport=object_store or "
                      "collective; an "
                      "engine in the actor's processes is resharded in place")
        return
    transport = config.rollout.weight_transport
    _choice(error, "rollout.weight_transport", transport, WEIGHT_TRANSPORTS)
    if transport == "shared_memory" and config.trainer.nnodes > 1:
        error.add("rollout.weight_transport", transport, "a host-shared copy reaches replicas on the trainer's "
                  f"host only; trainer.nnodes={config.trainer.nnodes}: use object_store (or auto)")
    timeout = config.rollout.weight_transport_timeout_s
    _require(error, "rollout.weight_transport_timeout_s", timeout, timeout > 0, "must be > 0 (seconds)")
    resolved = resolved_weight_transport(config)
    check_weight_delta(config, resolved, error)
    if resolved != "shared_memory" and config.async_training.partial_rollout:
        error.add("async_training.partial_rollout", True, "new weights reach a generation in flight through the "
                  f"host's shared memory, which the {resolved} weight transport does not use; turn partial "
                  "rollout off, or keep the pool on the trainer's host (rollout.weight_transport=shared_memory)")


def check_weight_delta(config: TrainConfig, transport: str, error: ConfigError) -> None:
    """``rollout.weight_delta``: deltas travel where bytes travel (the object store, a collective)."""
    every = config.rollout.weight_delta_full_every
    _require(error, "rollout.weight_delta_full_every", every, every >= 1, "must be >= 1 (1: every sync whole)")
    if config.rollout.weight_delta and transport == "shared_memory":
        error.add("rollout.weight_delta", True, "needs rollout.weight_transport=object_store or collective: with "
                  "shared_memory the replicas read the trainer's host-shared copy in place, no bytes travel to save")


def resolved_weight_transport(config: TrainConfig) -> str:
    """``rollout.weight_transport`` with ``auto`` resolved: ``shared_memory`` for a local Ray instance on one node
    (the pool is then on the trainer's host by construction), else ``object_store``."""
    transport = config.rollout.weight_transport
    if transport != "auto":
        return transport
    one_host = config.trainer.nnodes == 1 and config.trainer.ray.address == "local"
    return "shared_memory" if one_host else "object_store"
