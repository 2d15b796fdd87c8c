"""From a memory plan to advice: the largest micro-batch that keeps 10–20 % headroom, its accumulation steps, which
memory savers (per-micro-batch gradient sync, activation checkpointing, 8-bit optimizer states, offload) the job
needs, and whether it fits at all.

The savers are tried in order of what they cost, cheapest first; the first rung at which every phase fits is the
recommendation:

1. ``fsdp.grad_sync=micro_batch`` (actor and critic): the same update, bit for bit in exact arithmetic; it frees the
   unsharded fp32 gradients FSDP2 holds while accumulating (4 bytes per parameter on every rank — 28 GiB for 7B —
   down to the rank's shard, 3.5 GiB on 8 GPUs). The price is communication: K reduce-scatters of the whole gradient
   per optimizer step instead of one, each moving ≈ 4 bytes per parameter per rank and overlapped by FSDP2 with the
   next layer's backward. Inside one NVLink node that is ≈ 0.15 s per micro-batch for 7B against seconds of compute
   (a few %); across nodes (≈ 25 GB/s per GPU) ≈ 1 s, as much as checkpointing's recompute, so on a multi-node job it
   comes after checkpointing. No effect on a single rank (nothing is sharded), where it is skipped.
2. activation checkpointing (~30 % more compute in the update);
3. ``fsdp.gather_once=false`` (actor and critic), where it was on: the whole model's compute-dtype copy, kept through
   each step, goes (2 bytes per parameter in bf16 on a single GPU, where ``auto`` turns it on); per-layer gathering
   costs time instead (on one H200 a 0.5B PPO step of 8-row micro-batches ran 1.7× slower);
4. 8-bit optimizer states (a small change to the optimisation);
5. optimizer offload: the actor's during generation, the critic's outside its own update (a host copy per step);
6. the reference's parameters on the host (copied in for each of its forwards);
7. FSDP2 param offload of the actor and the critic (every update's optimizer step on the host: slow).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import data_parallel_size, role_plan, world_size
from hybridrl.planner.memory_plan import MemoryPlan, Setup, Shapes, plan_memory, setup_from
from hybridrl.autotune.memory_sizing import MicroBatchDecision, choose_micro_batch_size

# Each saver: the Setup fields it changes, with their values; SETUP_KEYS names the config key behind each field.
SAVERS = {
    "grad_sync": {"actor_grad_sync": "micro_batch", "critic_grad_sync": "micro_batch"},
    "checkpointing": {"checkpointing": True},
    "gather_once": {"actor_gather_once": False, "critic_gather_once": False},
    "actor_state_precision": {"actor_state_precision": "8bit"},
    "optimizer_offload": {"optimizer_offload": True, "critic_optimizer_offload": True},
    "ref_param_offload": {"ref_param_offload": True},
    "param_offload": {"param_offload": True, "critic_param_offload": True},
}
SETUP_KEYS = {"actor_grad_sync": "actor.fsdp.grad_sync", "critic_grad_sync": "critic.fsdp.grad_sync",
              "checkpointing": "model.enable_gradient_checkpointing",
              "actor_gather_once": "actor.fsdp.gather_once", "critic_gather_once": "critic.fsdp.gather_once",
              "actor_state_precision": "actor.optim.state_precision", "optimizer_offload": "actor.fsdp.optimizer_offload",
              "critic_optimizer_offload": "critic.fsdp.optimizer_offload", "ref_param_offload": "ref.param_offload",
              "param_offload": "actor.fsdp.param_offload", "critic_param_offload": "critic.fsdp.param_offload",
              "critic_state_precision": "critic.optim.state_precision",
              "actor_defer_all_reduce": "actor.fsdp.defer_all_reduce",
              "critic_defer_all_reduce": "critic.fsdp.defer_all_reduce"}


def saver_ladder(config: TrainConfig) -> list[str]:
    """The savers in the order they are tried for ``config`` (module docstring): per-micro-batch gradient sync first
    within a node, after checkpointing across nodes, left out on a single rank."""
    ladder = list(SAVERS)
    if world_size(config) == 1:
        ladder.remove("grad_sync")
    elif config.trainer.nnodes > 1:
        ladder[0:2] = ["checkpointing", "grad_sync"]
    return ladder


def _apply_saver(saver: str, setup: Setup, with_critic: bool) -> tuple[Setup, list[str]]:
    """``setup`` with ``saver`` on, and the overrides for the fields it changed (the critic's only if it trains)."""
    changes = {name: value for name, value in SAVERS[saver].items()
               if getattr(setup, name) != value and (with_critic or not name.startswith("critic_"))}
    overrides = [f"{SETUP_KEYS[name]}={str(value).lower() if isinstance(value, bool) else value}"
                 for name, value in changes.items()]
    return dataclasses.replace(setup, **changes), overrides


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
                                       measure_fn=measure, headroom=headroom, world_size=data_parallel_size(config, role),
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


@dataclass(frozen=True)
class Fitted:
    """A setup that fits: its plan, the micro-batch decisions, and the overrides beyond the savers' (micro-batches,
    vLLM's memory share)."""

    plan: MemoryPlan
    decisions: dict[str, MicroBatchDecision]
    overrides: list[str]
    reason: str = "fits"


def fit_setup(config: TrainConfig, shapes: Shapes, device_bytes: int, setup: Setup,
              headroom: float) -> Optional[Fitted]:
    """``setup`` with each trained role's largest fitting micro-batch and, if the step still does not fit, vLLM's
    largest memory share that lets it; ``None`` when neither makes every phase fit."""
    fitted, decisions = _fit_micro_batches(config, shapes, device_bytes, setup, headroom)
    if decisions is None:
        return None
    plan = plan_memory(config, shapes, device_bytes, fitted)
    if plan.fits(headroom):
        return Fitted(plan, decisions, _micro_overrides(config, decisions))
    utilization = _utilization_that_fits(plan, headroom)
    if utilization is None:
        return None
    plan = plan_memory(config, shapes, device_bytes, dataclasses.replace(fitted, gpu_memory_utilization=utilization))
    if not plan.fits(headroom):
        return None
    return Fitted(plan, decisions, [f"rollout.gpu_memory_utilization={utilization:g}"]
                  + _micro_overrides(config, decisions), f"fits once vLLM's share is set to {utilization:g}")


def recommend(config: TrainConfig, shapes: Shapes, device_bytes: int, headroom: float = 0.15) -> Recommendation:
    """Walk the ladder of memory savers (module docstring) until every phase fits ``device_bytes × (1 − headroom)``."""
    if not 0.0 <= headroom < 1.0:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    setup, overrides = setup_from(config), []
    with_critic = "critic" in plan_memory(config, shapes, device_bytes, setup).roles
    for saver in None, *saver_ladder(config):
        if saver is not None:
            setup, changed = _apply_saver(saver, setup, with_critic)
            if not changed:
                continue  # already on in the config
            overrides += changed
        fitted = fit_setup(config, shapes, device_bytes, setup, headroom)
        if fitted is not None:
            reason = fitted.reason if fitted.reason != "fits" else \
                "fits" + (" with " + ", ".join(overrides) if overrides else "")
            return Recommendation(True, fitted.plan, overrides + fitted.overrides, fitted.decisions, reason)
    plan = plan_memory(config, shapes, device_bytes, setup)
    return Recommendation(False, plan, overrides, {}, "does not fit even with every memory saver on: shard over "
                          "more GPUs (trainer.n_gpus_per_node / nnodes), shorten data.max_prompt_length / "
                          "max_response_length, or pick a larger GPU")


def _micro_overrides(config: TrainConfig, decisions: dict[str, MicroBatchDecision]) -> list[str]:
    return [f"{role}.ppo_micro_batch_size_per_gpu={decision.micro_batch_size}"
            for role, decision in decisions.items()
            if decision.micro_batch_size != getattr(config, role).ppo_micro_batch_size_per_gpu]
