"""``hybridrl plan`` for a reward-model job (``hybridrl rm``): one FSDP2-trained scalar-head model, pairs of
sequences (chosen and rejected go through together), no rollout.

The same models as the RL planner's: memory of a trained role (:func:`~hybridrl.planner.memory_plan.trained_role`
with a value head), the update's collectives (:mod:`hybridrl.planner.comm_plan`), roofline compute, host copies of
parameter offload; the search tries every combination of its savers (per-micro-batch gradient sync, checkpointing,
per-layer gathering, parameter offload, HSDP's all-reduce per micro-batch) with the largest micro-batch that keeps
the headroom, in each sharding (on several nodes: HSDP within a node, or full sharding), and keeps the fastest.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Optional

from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.autotune.memory_sizing import ForwardLayout
from hybridrl.config.precision import DTYPE_BYTES, precision_mode
from hybridrl.config.sizes import gathers_once, shard_group_ranks
from hybridrl.planner.comm_plan import ShardLayout, Topology, overlapped_seconds, update_collectives
from hybridrl.planner.hardware import GpuSpec
from hybridrl.planner.memory_plan import (CUDA_CONTEXT_BYTES, NCCL_BUFFER_BYTES, RoleMemory, defers_all_reduce,
                                          holds_unsharded_gradients, trained_role, value_shape)
from hybridrl.planner.search import offloaded_update_seconds
from hybridrl.planner.time_plan import forward_flops

PHASE = "update_reward_model"
KEYS = {"micro_batch": "data.micro_batch_size_per_gpu", "checkpointing": "model.enable_gradient_checkpointing",
        "grad_sync": "fsdp.grad_sync", "gather_once": "fsdp.gather_once", "param_offload": "fsdp.param_offload",
        "defer_all_reduce": "fsdp.defer_all_reduce", "fsdp_size": "fsdp.fsdp_size"}
SAVERS = {"grad_sync": ("grad_sync", "micro_batch"), "checkpointing": ("checkpointing", True),
          "gather_once": ("gather_once", False), "param_offload": ("param_offload", True),
          "all_reduce_every_micro_batch": ("defer_all_reduce", False)}


@dataclass(frozen=True)
class RMSetup:
    """What the search varies (``micro_batch`` in pairs)."""

    micro_batch: int
    checkpointing: bool
    grad_sync: str
    gather_once: bool
    param_offload: bool
    defer_all_reduce: bool
    fsdp_size: int = -1


@dataclass(frozen=True)
class RMPlan:
    """One setup's memory and time on one device."""

    setup: RMSetup
    role: RoleMemory
    fixed_bytes: int
    compute_seconds: float
    seconds: float
    collectives: list
    layout: ShardLayout

    @property
    def peak_bytes(self) -> int:
        return self.role.total + self.fixed_bytes


def rm_world(config) -> int:
    """The job's ranks: ``trainer.nnodes × trainer.n_gpus_per_node``."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def setup_of(config) -> RMSetup:
    world = rm_world(config)
    return RMSetup(config.data.micro_batch_size_per_gpu, config.model.enable_gradient_checkpointing,
                   config.fsdp.grad_sync, gathers_once(config.fsdp.gather_once, "cuda", world),
                   config.fsdp.param_offload, config.fsdp.defer_all_reduce, config.fsdp.fsdp_size)


def plan_rm(config, shape: DecoderShape, gpu: GpuSpec, topology: Topology, setup: RMSetup,
            efficiency: float = 0.4) -> RMPlan:
    """Memory and step time of ``config``'s reward-model job with ``setup``."""
    world = rm_world(config)
    group = shard_group_ranks(setup.fsdp_size, world)
    local_pairs = config.data.train_batch_size // world
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    mode = precision_mode(config.model.dtype, config.fsdp.reduce_dtype, config.optim.state_precision,
                          config.model.fp8_compute)
    role = trained_role("reward_model", value_shape(shape), ForwardLayout.padded(2 * setup.micro_batch, seq_len),
                        world=group, mode=mode, checkpointing=setup.checkpointing, param_offload=setup.param_offload,
                        accumulating=holds_unsharded_gradients(setup.grad_sync, local_pairs, setup.micro_batch),
                        gather_once=setup.gather_once, deferred_all_reduce=defers_all_reduce(
                            setup.fsdp_size, world, setup.grad_sync, local_pairs, setup.micro_batch,
                            setup.defer_all_reduce))
    layout = ShardLayout(shard_group=group, replicas=world // group, optimizer_steps=1,
                         micro_batches=local_pairs // setup.micro_batch, gather_once=setup.gather_once,
                         grad_sync=setup.grad_sync, compute_bytes=DTYPE_BYTES[config.model.dtype],
                         reduce_bytes=DTYPE_BYTES[config.fsdp.reduce_dtype],
                         defer_all_reduce=setup.defer_all_reduce)
    collectives = update_collectives(PHASE, shape, layout, topology, head="value")
    passes = 4 if setup.checkpointing else 3
    peak = gpu.fp8_flops if (config.model.fp8_compute and gpu.supports_fp8) else gpu.bf16_flops
    compute = passes * 2 * config.data.train_batch_size * forward_flops(shape, seq_len, with_lm_head=False) / (
        world * peak * efficiency)
    seconds = overlapped_seconds(compute, layout, collectives)
    if setup.param_offload:
        seconds += offloaded_update_seconds(role, layout, collectives)
    fixed = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if world > 1 else 0)
    return RMPlan(setup, role, fixed, compute, seconds, collectives, layout)


def search_rm(config, shape: DecoderShape, gpu: GpuSpec, topology: Topology, headroom: float = 0.15,
              efficiency: float = 0.4) -> list[RMPlan]:
    """Every saver combination, in each sharding (the configured one; on several nodes also HSDP within a node and
    full sharding), at its largest fitting micro-batch (a divisor of the per-rank pairs), fastest first."""
    world = rm_world(config)
    local = config.data.train_batch_size // world
    configured = -1 if config.fsdp.fsdp_size == world else config.fsdp.fsdp_size  # the same layout
    sizes = [config.fsdp.fsdp_size] + ([size for size in (config.trainer.n_gpus_per_node, -1)
                                        if size != configured] if config.trainer.nnodes > 1 else [])
    found = []
    for fsdp_size in sizes:
        base = dataclasses.replace(setup_of(config), checkpointing=False, grad_sync="step", param_offload=False,
                                   defer_all_reduce=True, fsdp_size=fsdp_size)
        names = [name for name, (field, value) in SAVERS.items() if getattr(base, field) != value
                 and not (name == "grad_sync" and world == 1)
                 and not (name == "all_reduce_every_micro_batch" and shard_group_ranks(fsdp_size, world) == world)]
        for size in range(len(names) + 1):
            for chosen in itertools.combinations(names, size):
                setup = dataclasses.replace(base, **dict(SAVERS[name] for name in chosen))
                plan = _largest_fitting(config, shape, gpu, topology, setup, local, headroom, efficiency)
                if plan is not None:
                    found.append(plan)
    return sorted(found, key=lambda plan: plan.seconds)


def _largest_fitting(config, shape, gpu, topology, setup, local, headroom, efficiency) -> Optional[RMPlan]:
    for micro in sorted((size for size in range(1, local + 1) if local % size == 0), reverse=True):
        plan = plan_rm(config, shape, gpu, topology, dataclasses.replace(setup, micro_batch=micro), efficiency)
        if plan.peak_bytes <= gpu.memory_bytes * (1 - headroom):
            return plan
    return None


def overrides(configured: RMSetup, chosen: RMSetup) -> list[str]:
    return [f"{KEYS[field]}={str(value).lower() if isinstance(value, bool) else value}"
            for field in KEYS if (value := getattr(chosen, field)) != getattr(configured, field)]
