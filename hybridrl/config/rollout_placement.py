"""Where the rollout engines run: in the actor's processes, or as replicas in processes of their own.

Three placements (docs/concepts.md, "Where generation runs"):

- **in the actor** (``rollout.n_gpus = 0``, ``rollout.engine_process=actor``): each actor rank's process holds one
  tensor-parallel rank of an engine (the hybrid engine); weights are resharded straight into it.
- **own processes, on the actor's devices** (``n_gpus = 0``, ``engine_process=own``): ``devices / t_g`` replicas,
  each a ``RolloutWorker`` group of ``t_g`` processes placed on the actor's bundles beside its ranks.
- **own processes, own devices** (``n_gpus = M``): the standalone pool, ``M / t_g`` replicas.

The two "own" placements share everything past the placement: the replicas, the published weights and their
check, the per-replica agent loop. ``engine_process=auto`` picks ``own`` only where the actor's process cannot hold
the engine — an architecture vLLM serves through its Transformers backend (``config/vllm_architectures.py``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from hybridrl.config.checks import _choice
from hybridrl.config.components import registered_component
from hybridrl.config.errors import ConfigError
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import world_size
from hybridrl.config.vllm_architectures import vllm_support

ENGINE_PROCESSES = ("auto", "actor", "own")


@functools.lru_cache(maxsize=16)
def model_architectures(model_path: str) -> tuple[str, ...]:
    """The ``architectures`` of ``model_path``'s ``config.json`` (empty when it cannot be read: path checks
    report that)."""
    try:
        model_config = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    return tuple(str(name) for name in model_config.get("architectures") or ())


def served_through_transformers_backend(model_path: str) -> list[str]:
    """The architectures of ``model_path`` that the installed vLLM serves through its Transformers backend."""
    return [name for name in model_architectures(model_path) if vllm_support(name) == "transformers_backend"]


def resolved_engine_process(config: TrainConfig) -> str:
    """``actor`` (the engine lives in the actor's processes, or there is none to place: ``rollout.name=hf``) or
    ``own`` (replicas in processes of their own: a standalone pool, or ``engine_process`` resolved to ``own``)."""
    rollout = config.rollout
    if rollout.n_gpus > 0:
        return "own"
    if generates_with_actor_module(rollout.name) or rollout.engine_process == "actor":
        return "actor"
    if rollout.engine_process == "own":
        return "own"
    return "own" if served_through_transformers_backend(config.model.path) else "actor"


def generates_with_actor_module(engine_name: str) -> bool:
    """Whether the engine registered as ``engine_name`` samples from the actor's own module (``hf``, or a recipe's
    engine that says so): it has no weights of its own and lives where the actor does."""
    if engine_name == "hf":
        return True
    engine = registered_component("rollout.name", engine_name)
    return bool(getattr(engine, "generates_with_actor_module", False))


def replicas_apart(config: TrainConfig) -> bool:
    """Whether the engines run as replicas in processes of their own (the actor group then only publishes weights)."""
    return resolved_engine_process(config) == "own"


def colocated_replicas(config: TrainConfig) -> bool:
    """Replicas in processes of their own on the actor's devices (``n_gpus = 0``, ``engine_process`` → ``own``)."""
    return config.rollout.n_gpus == 0 and replicas_apart(config)


def generation_devices(config: TrainConfig) -> int:
    """The devices the engines generate on: a standalone pool's (``rollout.n_gpus``), else the actor's."""
    return config.rollout.n_gpus or world_size(config)


def replica_count(config: TrainConfig) -> int:
    """How many replicas run apart from the actor: ``rollout.n_gpus / t_g``, or ``devices / t_g`` colocated; 0 when
    the engines are in the actor's processes."""
    if not replicas_apart(config):
        return 0
    return generation_devices(config) // config.rollout.tensor_model_parallel_size


def check_engine_process(config: TrainConfig, error: ConfigError) -> None:
    """``rollout.engine_process``: a known choice, and one that means something for the engine and pool chosen."""
    rollout, key = config.rollout, "rollout.engine_process"
    _choice(error, key, rollout.engine_process, ENGINE_PROCESSES)
    if rollout.engine_process == "own" and generates_with_actor_module(rollout.name):
        error.add(key, "own", f"rollout.name={rollout.name} generates with the actor's own module, in the actor's "
                              "process; replicas of their own need an engine with its own weights (rollout.name=vllm)")
    if rollout.engine_process == "actor" and rollout.n_gpus > 0:
        error.add(key, "actor", f"rollout.n_gpus={rollout.n_gpus} runs the engines on devices of their own, in "
                                "processes of their own; set rollout.n_gpus=0 to keep them in the actor's")
