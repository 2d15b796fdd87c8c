"""The layout search behind ``hybridrl plan``'s recommendation: every memory saver and layout, the fastest that fits.

What it varies:

- the layout: vLLM's tensor-parallel size (1, 2, 4, 8 within a node; the weights of a 7B model do not fit one A10G's
  share at TP 1) and, on several nodes, HSDP (shard within a node, replicate across) against full sharding;
- the exact memory savers: per-micro-batch gradient sync (under HSDP also its all-reduce across groups after every
  micro-batch, without the buffer that defers it to the step's last), activation checkpointing, per-layer gathering where
  ``gather_once`` was on, the actor's and the critic's optimizer offload, the reference's parameters on the host,
  the actor's and the critic's FSDP2 parameter offload;
- the micro-batch of each trained role: the largest that fits (:func:`~hybridrl.planner.recommendation.fit_setup`),
  which sets the accumulation steps, and vLLM's memory share where it must shrink.

Every set of savers that fits is timed (more savers can be faster: checkpointing's recompute may buy a micro-batch
large enough to save more communication than it costs): the roofline compute (checkpointing's recompute included),
the communication of its layout (:mod:`hybridrl.planner.comm_plan`) and its host copies (:func:`host_seconds`); the
fastest wins. 8-bit optimizer states change the optimisation a little, so they are searched only when no exact
layout fits. LoRA changes what is trained and is not searched.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Optional

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import shard_group_ranks, world_size
from hybridrl.config.validation import critic_enabled
from hybridrl.planner.comm_plan import LINKS, Collective, ShardLayout, StepComm, Topology, plan_communication
from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.planner.hardware import GpuSpec
from hybridrl.planner.memory_plan import MemoryPlan, RoleMemory, Setup, Shapes, plan_memory, setup_from
from hybridrl.planner.recommendation import SAVERS, SETUP_KEYS, Fitted, fit_setup
from hybridrl.planner.time_plan import generation_waves, roofline_step_time

EXACT_SAVERS = {
    "grad_sync": {"actor_grad_sync": "micro_batch", "critic_grad_sync": "micro_batch"},
    "all_reduce_every_micro_batch": {"actor_defer_all_reduce": False, "critic_defer_all_reduce": False},
    "checkpointing": SAVERS["checkpointing"],
    "gather_once": SAVERS["gather_once"],
    "actor_optimizer_offload": {"optimizer_offload": True},
    "critic_optimizer_offload": {"critic_optimizer_offload": True},
    "ref_param_offload": SAVERS["ref_param_offload"],
    "actor_param_offload": {"param_offload": True},
    "critic_param_offload": {"critic_param_offload": True},
}
EIGHT_BIT = {"actor_state_precision": "8bit", "critic_state_precision": "8bit"}
HOST_LINK = LINKS["pcie"]  # device <-> host copies
# A CPU AdamW step streams ~32 bytes per parameter (parameter, gradient, 2 moments; read and written): 10 GB/s is
# ~0.3 B parameters/s, about half of what ZeRO-Offload reports for PyTorch's own CPU Adam on a two-socket server.
HOST_ADAM_BYTES_PER_SECOND = 10e9


@dataclass(frozen=True)
class Candidate:
    """One layout that fits: the config it changes (TP, sharding), its savers, its memory, its step time."""

    layout: str
    config: TrainConfig
    savers: tuple[str, ...]
    fitted: Fitted
    comm: StepComm
    host_seconds: float
    overrides: list[str]
    exact: bool = True

    @property
    def phases(self) -> dict[str, float]:
        return {**self.comm.phases, **({"host_copies": self.host_seconds} if self.host_seconds else {})}

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())

    @property
    def memory(self) -> MemoryPlan:
        return self.fitted.plan

    @property
    def reason(self) -> str:
        """``fits`` when the configured layout fits as it is (micro-batches apart), else what was changed."""
        if configured([self]):
            return self.fitted.reason
        savers = ", ".join(self.savers) or "no memory saver"
        return f"fastest layout that fits: {self.layout}; {savers}"


def splits_heads(shape: DecoderShape, tp: int) -> bool:
    """Whether vLLM can split ``shape``'s attention over ``tp`` ranks: the heads evenly, the KV heads evenly or into
    whole replicas (as the config check of ``rollout.tensor_model_parallel_size`` requires)."""
    return shape.num_heads % tp == 0 and (shape.num_kv_heads % tp == 0 or tp % shape.num_kv_heads == 0)


def with_shard_groups(config: TrainConfig, actor: int, critic: int) -> TrainConfig:
    """``config`` with the actor's and the critic's ``fsdp.fsdp_size``."""
    replace = dataclasses.replace
    return replace(config, actor=replace(config.actor, fsdp=replace(config.actor.fsdp, fsdp_size=actor)),
                   critic=replace(config.critic, fsdp=replace(config.critic.fsdp, fsdp_size=critic)))


def layouts(config: TrainConfig, shape: DecoderShape,
            keep_layout: bool = False) -> list[tuple[str, TrainConfig, list[str]]]:
    """The layouts searched: (label, config, overrides) for each vLLM TP size that splits ``shape``'s heads and, on
    several nodes, HSDP within a node and full sharding (both roles alike); the configured layout first (alone with
    ``keep_layout``)."""
    world, per_node = world_size(config), config.trainer.n_gpus_per_node
    tp_sizes = [config.rollout.tensor_model_parallel_size]
    if config.rollout.name == "vllm" and not config.rollout.n_gpus and not keep_layout:
        tp_sizes += [tp for tp in (1, 2, 4, 8) if per_node % tp == 0 and tp not in tp_sizes and splits_heads(shape, tp)]
    group = lambda size: world if size == -1 else size  # noqa: E731  (-1 and the world size are one layout)
    configured = (group(config.actor.fsdp.fsdp_size), group(config.critic.fsdp.fsdp_size))
    groups = [configured]
    if config.trainer.nnodes > 1 and not keep_layout:
        groups += [(size, size) for size in (per_node, world) if (size, size) not in groups]
    found = []
    for tp, (actor, critic) in itertools.product(tp_sizes, groups):
        shards = (config.actor.fsdp.fsdp_size, config.critic.fsdp.fsdp_size) if (actor, critic) == configured else \
            (actor, critic)  # the configured layout keeps its own spelling (-1 or the world size)
        varied = dataclasses.replace(with_shard_groups(config, *shards),
                                     rollout=dataclasses.replace(config.rollout, tensor_model_parallel_size=tp))
        overrides = [f"rollout.tensor_model_parallel_size={tp}"] if tp != tp_sizes[0] else []
        for role, size, was in (("actor", actor, configured[0]), ("critic", critic, configured[1])):
            if size != was and (role == "actor" or critic_enabled(config)):
                overrides.append(f"{role}.fsdp.fsdp_size={-1 if size == world else size}")
        found.append((f"rollout TP {tp}, {_sharding_label(actor, world)}"
                      + ("" if critic == actor else f" (critic {_sharding_label(critic, world)})"), varied, overrides))
    return found


def _sharding_label(group: int, world: int) -> str:
    return "full shard" if group == world else f"HSDP {world // group} x {group}"


SAVERS_OFF = dict(actor_grad_sync="step", critic_grad_sync="step", actor_defer_all_reduce=True,
                  critic_defer_all_reduce=True, checkpointing=False, optimizer_offload=False,
                  critic_optimizer_offload=False, ref_param_offload=False, param_offload=False,
                  critic_param_offload=False)
OFFLOADS = (("actor_optimizer_offload", "actor_param_offload"), ("critic_optimizer_offload", "critic_param_offload"))


def applicable_savers(config: TrainConfig, setup: Setup, roles: set[str], savers: dict) -> list[str]:
    """The savers that change something for this job (a role it has, a setting not already on)."""
    names = []
    for name, changes in savers.items():
        relevant = _for_roles(changes, roles)
        if name == "grad_sync" and world_size(config) == 1:
            continue
        if name == "all_reduce_every_micro_batch" and not hsdp(config):
            continue
        if any(getattr(setup, field) != value for field, value in relevant.items()):
            names.append(name)
    return names


def hsdp(config: TrainConfig) -> bool:
    """Whether the actor or the critic is sharded in groups smaller than the world (HSDP)."""
    world = world_size(config)
    return any(shard_group_ranks(role.fsdp.fsdp_size, world) < world for role in (config.actor, config.critic))


def _for_roles(changes: dict, roles: set[str]) -> dict:
    return {field: value for field, value in changes.items()
            if not (field.startswith("critic_") and "critic" not in roles)
            and not (field.startswith("ref_") and "ref" not in roles)}


def apply_savers(setup: Setup, names: tuple[str, ...], savers: dict, roles: set[str]) -> Setup:
    """``setup`` with the savers ``names`` on."""
    changes = {}
    for name in names:
        changes.update(_for_roles(savers[name], roles))
    return dataclasses.replace(setup, **changes)


def setup_overrides(configured: Setup, chosen: Setup) -> list[str]:
    """The config overrides that turn ``configured`` into ``chosen`` (savers on or off; micro-batches apart)."""
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}"
            for field, key in SETUP_KEYS.items()
            if (value := getattr(chosen, field)) != getattr(configured, field)]


def meaningful(chosen: tuple[str, ...]) -> bool:
    """False for a set with a role's optimizer offload beside its parameter offload (which holds the state on the
    host already): the same layout as without it."""
    return not any(optimizer in chosen and parameters in chosen for optimizer, parameters in OFFLOADS)


def offloaded_update_seconds(role: RoleMemory, layout: ShardLayout, update: list[Collective]) -> float:
    """Host seconds of an FSDP2 ``param_offload`` role's updates: its fp32 parameter shard copied in for every
    all-gather, its gradient shard out after every reduction, and each optimizer step run on the host."""
    gathers = sum(c.calls for c in update if c.kind == "all_gather") or layout.optimizer_steps
    shard = role.host_parameters  # fp32: the gradient shard coming out is as large
    reductions = layout.optimizer_steps * (layout.micro_batches if layout.grad_sync == "micro_batch" else 1)
    return ((gathers + reductions) * shard / HOST_LINK.bytes_per_second
            + layout.optimizer_steps * 2 * shard / HOST_ADAM_BYTES_PER_SECOND)


def host_seconds(plan: MemoryPlan, setup: Setup, comm: StepComm) -> float:
    """Seconds of host copies per step: optimizer state out and back (per offloaded role), parameters in for every
    all-gather of an offloaded model, and an offloaded role's optimizer steps on the host."""
    seconds = 0.0
    roles = plan.roles
    for role, offloaded in (("actor", setup.optimizer_offload and not setup.param_offload),
                            ("critic", setup.critic_optimizer_offload and not setup.critic_param_offload)):
        if offloaded and role in roles:
            seconds += 2 * roles[role].optimizer / HOST_LINK.bytes_per_second
    for role, offloaded in (("actor", setup.param_offload), ("critic", setup.critic_param_offload)):
        if offloaded and role in roles:
            update = [c for c in comm.plan.collectives if c.phase == f"update_{role}"]
            seconds += offloaded_update_seconds(roles[role], comm.layouts[role], update)
    if setup.ref_param_offload and "ref" in roles:  # copied in for every all-gather of its pass
        seconds += comm.forward_gathers * roles["ref"].host_parameters / HOST_LINK.bytes_per_second
    return seconds


def timed(label: str, config: TrainConfig, shapes: Shapes, gpu: GpuSpec, topology: Topology, efficiency: float,
          savers: tuple[str, ...], fitted: Fitted, overrides: list[str], exact: bool) -> Candidate:
    setup = fitted.plan.setup
    checkpointed = dataclasses.replace(config, model=dataclasses.replace(
        config.model, enable_gradient_checkpointing=setup.checkpointing))
    compute = roofline_step_time(checkpointed, shapes.policy, gpu, efficiency=efficiency,
                                 waves=generation_waves(config, shapes.policy, fitted.plan))
    comm = plan_communication(config, shapes, topology, compute.phases, setup)
    return Candidate(label, config, savers, fitted, comm, host_seconds(fitted.plan, setup, comm),
                     overrides + fitted.overrides, exact)


def search(config: TrainConfig, shapes: Shapes, gpu: GpuSpec, topology: Topology, *, headroom: float = 0.15,
           efficiency: float = 0.4, keep_layout: bool = False) -> list[Candidate]:
    """Every setup that fits, in every layout (the configured one only, with ``keep_layout``), fastest first; 8-bit
    optimizer states only when no exact setup fits."""
    found = _search(config, shapes, gpu, topology, headroom, efficiency, EXACT_SAVERS, True, keep_layout)
    if not found:
        found = _search(config, shapes, gpu, topology, headroom, efficiency, {**EXACT_SAVERS, "8bit": EIGHT_BIT},
                        False, keep_layout)
    return sorted(found, key=lambda candidate: (round(candidate.seconds, 6), len(candidate.savers)))


def _search(config, shapes, gpu, topology, headroom, efficiency, savers: dict, exact: bool,
            keep_layout: bool) -> list[Candidate]:
    found = []
    device = gpu.memory_bytes
    for label, varied, layout_overrides in layouts(config, shapes.policy, keep_layout):
        configured = setup_from(varied)
        off = {field: value for field, value in SAVERS_OFF.items()  # HSDP's all-reduce setting matters under HSDP only
               if hsdp(varied) or not field.endswith("defer_all_reduce")}
        base = dataclasses.replace(configured, **off)  # the configured savers are searched like the others
        roles = set(plan_memory(varied, shapes, device, base).roles)
        names = applicable_savers(varied, base, roles, savers)
        for size in range(len(names) + 1):
            for chosen in filter(meaningful, itertools.combinations(names, size)):
                setup = apply_savers(base, chosen, savers, roles)
                fitted = fit_setup(varied, shapes, device, setup, headroom)
                if fitted is not None:
                    found.append(timed(label, varied, shapes, gpu, topology, efficiency, chosen, fitted,
                                       layout_overrides + setup_overrides(configured, setup), exact))
    return found


def configured(candidates: list[Candidate]) -> Optional[Candidate]:
    """The candidate that is the config as given (its layout and savers; micro-batches may differ), if it fits."""
    micro = ("ppo_micro_batch_size_per_gpu", "gpu_memory_utilization")
    for candidate in candidates:
        if not [override for override in candidate.overrides if not any(key in override for key in micro)]:
            return candidate
    return None
