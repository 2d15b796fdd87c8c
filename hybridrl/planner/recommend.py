"""From a memory plan to advice: the largest micro-batch that keeps 10–20 % headroom, its accumulation steps, which
memory savers (activation checkpointing, 8-bit optimizer states, offload) the job needs, and whether it fits at all.

The savers are tried in order of what they cost: checkpointing (~30 % more compute in the update), 8-bit optimizer
states (a small change to the optimisation), optimizer offload during generation (a host copy per step), FSDP2 param
offload (every update's step on the host: slow). The first rung at which every phase fits is the recommendation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import role_plan, world_size
from hybridrl.planner.memory_plan import MemoryPlan, Setup, Shapes, plan_memory, setup_from
from hybridrl.workers.memory_sizing import MicroBatchDecision, choose_micro_batch_size

# (the change, the config override that makes it)
SAVERS = (
    ("checkpointing", "model.enable_gradient_checkpointing=true"),
    ("actor_state_precision", "actor.optim.state_precision=8bit"),
    ("optimizer_offload", "actor.fsdp.optimizer_offload=true"),
    ("param_offload", "actor.fsdp.param_offload=true"),
)
SAVER_VALUES = {"checkpointing": True, "actor_state_precision": "8bit", "optimizer_offload": True,
                "param_offload": True}


@dataclass(frozen=True)
class Recommendation:
    """The advised settings, their plan, and the overrides that turn the config into them."""

    fits: bool
    plan: MemoryPlan
    overrides: list[str] = field(default_factory=list)
    decisions: dict[str, MicroBatchDecision] = field(default_factory=dict)
    reason: str = ""


def _largest_micro_batch(config: TrainConfig, shapes: Shapes, device_bytes: int, setup: Setup, role: str,
                         headroom: float) -> Optional[MicroBatchDecision]:
    """The largest micro-batch of ``role`` at which the whole step fits (``None``: not even 1)."""
    attribute = f"{role}_micro_batch"

    def measure(micro_batch: int, _seq_len: int) -> float:
        changed = dataclasses.replace(setup, **{attribute: micro_batch})
        return float(plan_memory(config, shapes, device_bytes, changed).peak_bytes)

    seq_len = config.data.max_prompt_length + config.data.max_response_length
    local = role_plan(config, role).local_mini_batch_sequences
    try:
        return choose_micro_batch_size(device_bytes, seq_len=seq_len, local_mini_batch_size=local,
                                       measure_fn=measure, headroom=headroom, world_size=world_size(config),
                                       log=False)  # the report prints the decision
    except ValueError:
        return None


def _fit_micro_batches(config: TrainConfig, shapes: Shapes, device_bytes: int, setup: Setup,
                       headroom: float) -> tuple[Setup, Optional[dict[str, MicroBatchDecision]]]:
    """Each trained role's largest fitting micro-batch (actor first); ``None`` decisions: a role fits at none."""
    decisions: dict[str, MicroBatchDecision] = {}
    roles = ["actor"] + (["critic"] if "critic" in plan_memory(config, shapes, device_bytes, setup).roles else [])
    for role in roles:
        if getattr(config, role).use_dynamic_bsz:
            continue  # a token budget, not a sequence count: the plan sizes that budget as configured
        decision = _largest_micro_batch(config, shapes, device_bytes, setup, role, headroom)
        if decision is None:
            return setup, None
        decisions[role] = decision
        setup = dataclasses.replace(setup, **{f"{role}_micro_batch": decision.micro_batch_size})
    return setup, decisions


def _utilization_that_fits(plan: MemoryPlan, headroom: float) -> Optional[float]:
    """vLLM's largest ``gpu_memory_utilization`` (a multiple of 0.05) at which generation fits, if any leaves a KV
    cache."""
    rollout = plan.roles["rollout"]
    if not rollout.role.startswith("rollout (vllm"):
        return None
    others = plan.phases["generate"] - rollout.total
    room = plan.device_bytes * (1 - headroom) - others
    utilization = math.floor(20 * room / plan.device_bytes) / 20
    engine_floor = rollout.parameters + rollout.activations + rollout.buffers
    return utilization if utilization * plan.device_bytes > engine_floor else None


def recommend(config: TrainConfig, shapes: Shapes, device_bytes: int, headroom: float = 0.15) -> Recommendation:
    """Walk the ladder of memory savers (module docstring) until every phase fits ``device_bytes × (1 − headroom)``."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    setup, overrides = setup_from(config), []
    for saver, override in (None, None), *SAVERS:
        if saver is not None:
            if getattr(setup, saver) == SAVER_VALUES[saver]:
                continue  # already on in the config
            setup = dataclasses.replace(setup, **{saver: SAVER_VALUES[saver]})
            overrides.append(override)
        fitted, decisions = _fit_micro_batches(config, shapes, device_bytes, setup, headroom)
        if decisions is None:
            continue
        plan = plan_memory(config, shapes, device_bytes, fitted)
        if plan.fits(headroom):
            return Recommendation(True, plan, overrides + _micro_overrides(config, decisions), decisions,
                                  "fits" + (" with " + ", ".join(overrides) if overrides else ""))
        utilization = _utilization_that_fits(plan, headroom)
        if utilization is not None:
            fitted = dataclasses.replace(fitted, gpu_memory_utilization=utilization)
            plan = plan_memory(config, shapes, device_bytes, fitted)
            extra = [f"rollout.gpu_memory_utilization={utilization:g}"]
            if not plan.fits(headroom):
                continue
            return Recommendation(True, plan, overrides + extra + _micro_overrides(config, decisions), decisions,
                                  f"fits once vLLM's share is set to {utilization:g}")
    plan = plan_memory(config, shapes, device_bytes, setup)
    return Recommendation(False, plan, overrides, {}, "does not fit even with every memory saver on: shard over "
                          "more GPUs (trainer.n_gpus_per_node / nnodes), shorten data.max_prompt_length / "
                          "max_response_length, or pick a larger GPU")


def _micro_overrides(config: TrainConfig, decisions: dict[str, MicroBatchDecision]) -> list[str]:
    return [f"{role}.ppo_micro_batch_size_per_gpu={decision.micro_batch_size}"
            for role, decision in decisions.items()
            if decision.micro_batch_size != getattr(config, role).ppo_micro_batch_size_per_gpu]
