"""Per-device memory of a whole RL job: every colocated role (actor, reference, critic, reward model, rollout engine)
broken into parameters, gradients, optimizer states, activations, KV cache and buffers, and the peak over the step's
phases.

All roles share each device (the hybrid engine, docs/architecture.md §1), so what must fit is, phase by phase, what every role
keeps resident plus what the running phase adds:

- ``generate``: model states of every role (the actor's optimizer state leaves with ``actor.fsdp.optimizer_offload``,
  the critic's — in every phase but its own update — with ``critic.fsdp.optimizer_offload``)
  + the rollout engine (vLLM: ``gpu_memory_utilization`` × device memory — its weights, KV cache and activations;
  HF ``generate``: the KV cache of this rank's sequences on the actor's own module).
- ``log_probs``: states + no-grad forwards of the actor/reference and the critic (they run concurrently).
- ``update_actor`` / ``update_critic``: states + that role's gradients and one micro-batch's activation peak (the
  analytic model of :mod:`hybridrl.autotune.memory_sizing`, validated against measured allocations). With
  ``fsdp.grad_sync=step`` and several micro-batches the gradients are the whole model's, unsharded, in the reduce dtype
  (FSDP2 holds them between micro-batches); with ``micro_batch`` only this rank's shard.

With ``rollout.free_cache_engine`` the engine sleeps outside generation (vLLM drops its KV cache and moves its weights
to host memory), so it costs nothing in the other phases. FSDP2 ``param_offload`` keeps parameters, gradients and
optimizer state of that role on the host (only the gathered layers in flight stay on the device).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.precision import DTYPE_BYTES, PrecisionMode, precision_mode
from hybridrl.config.rollout_placement import colocated_replicas
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import gathers_once, role_plan, shard_group_ranks, world_size
from hybridrl.config.validation import critic_enabled
from hybridrl.autotune.memory_sizing import (
    FP32,
    DecoderShape,
    ForwardLayout,
    Precision,
    activation_bytes,
    model_state_bytes,
)

GIB = 2**30
CUDA_CONTEXT_BYTES = GIB // 2  # CUDA context + cuBLAS workspace: outside the allocator, but on the device
NCCL_BUFFER_BYTES = GIB // 2  # NCCL's communication buffers when more than one rank


@dataclass(frozen=True)
class RoleMemory:
    """One role's bytes on one device. ``activations``: the peak of one micro-batch of its own phase (training or
    forward-only); ``buffers``: gathered parameters/gradients in flight, sync buckets, fixed runtime reserves;
    ``offloaded``: bytes kept in host memory by offload settings (not counted on the device), ``host_parameters`` the
    parameters' part of them (what an offloaded model copies in for each all-gather)."""

    role: str
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    kv_cache: int = 0
    buffers: int = 0
    offloaded: int = 0
    note: str = ""
    host_parameters: int = 0

    @property
    def resident(self) -> int:
        """What stays on the device between this role's own phases (parameters and optimizer state)."""
        return self.parameters + self.optimizer

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.kv_cache + self.buffers


@dataclass(frozen=True)
class Setup:
    """The memory-relevant settings the recommender varies (defaults read from the config by :func:`setup_from`)."""

    actor_micro_batch: int
    critic_micro_batch: int
    checkpointing: bool
    actor_state_precision: str
    critic_state_precision: str
    optimizer_offload: bool
    param_offload: bool
    gpu_memory_utilization: float
    actor_grad_sync: str = "step"
    critic_grad_sync: str = "step"
    actor_gather_once: bool = False
    critic_gather_once: bool = False
    critic_optimizer_offload: bool = False
    critic_param_offload: bool = False
    ref_param_offload: bool = False
    actor_defer_all_reduce: bool = True
    critic_defer_all_reduce: bool = True


def setup_from(config: TrainConfig) -> Setup:
    actor, critic = config.actor, config.critic
    return Setup(critic_optimizer_offload=critic.fsdp.optimizer_offload, critic_param_offload=critic.fsdp.param_offload,
                 ref_param_offload=config.ref.param_offload,
                 actor_defer_all_reduce=actor.fsdp.defer_all_reduce, critic_defer_all_reduce=critic.fsdp.defer_all_reduce,
                 actor_micro_batch=actor.ppo_micro_batch_size_per_gpu or 1,
                 critic_micro_batch=critic.ppo_micro_batch_size_per_gpu or 1,
                 actor_grad_sync=actor.fsdp.grad_sync, critic_grad_sync=critic.fsdp.grad_sync,
                 checkpointing=config.model.enable_gradient_checkpointing,
                 actor_state_precision=actor.optim.state_precision, critic_state_precision=critic.optim.state_precision,
                 optimizer_offload=actor.fsdp.optimizer_offload, param_offload=actor.fsdp.param_offload,
                 gpu_memory_utilization=config.rollout.gpu_memory_utilization,
                 actor_gather_once=gathers_once(actor.fsdp.gather_once, "cuda", world_size(config)),
                 critic_gather_once=gathers_once(critic.fsdp.gather_once, "cuda", world_size(config)))


@dataclass(frozen=True)
class MemoryPlan:
    """Every role's breakdown and each phase's total on one device; ``peak_phase`` is the largest."""

    setup: Setup
    roles: dict[str, RoleMemory]
    phases: dict[str, int]
    device_bytes: int
    precision: dict[str, PrecisionMode] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.__getitem__)

    @property
    def peak_bytes(self) -> int:
        return self.phases[self.peak_phase]

    def fits(self, headroom: float) -> bool:
        """Every phase within ``device_bytes × (1 − headroom)`` and no role unable to work (``problems``)."""
        return not self.problems and self.peak_bytes <= self.device_bytes * (1 - headroom)


# ------------------------------------------------------------------------------------------------------ role models
def training_layout(config: TrainConfig, role: str, micro_batch: int) -> ForwardLayout:
    """The worst-case micro-batch of ``role``: full-length rows (max prompt + max response), responses scored,
    split over the role's ``ulysses_sequence_parallel_size`` ranks.

    ``model.share_prompts`` is not modelled: it replaces padded rows only when that costs fewer FLOPs and holds at
    most twice their attention scores (``hybridrl.modeling.shared_prompts.grouping_pays``), with fewer rows through
    every other activation."""
    role_config = getattr(config, role)
    sp = role_config.ulysses_sequence_parallel_size
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    attention = config.model.attn_implementation
    if role_config.use_dynamic_bsz:  # a budget per device: a group of SP ranks shares SP × that
        return ForwardLayout.packed(role_config.ppo_max_token_len_per_gpu * sp, attention=attention).split(sp)
    if config.model.use_remove_padding:
        return ForwardLayout.packed(micro_batch * seq_len, micro_batch * config.data.max_response_length,
                                    attention=attention).split(sp)
    return ForwardLayout.padded(micro_batch, seq_len, config.data.max_response_length,
                                masked=attention != "flash_attention_2").split(sp)


def forward_only_bytes(shape: DecoderShape, layout: ForwardLayout, compute_bytes: int) -> int:
    """Peak of a no-grad forward (log-probs, values, scores): fp32 logits ``[N, V]`` (split: this rank's share of the
    scored rows) and their compute-dtype source,
    one layer's transients (normed input, q/k/v, attention output, the gated MLP's ``[N, I]`` pair; this rank's share
    of the positions under sequence parallelism) and the mask."""
    c, n = compute_bytes, layout.num_tokens
    head = layout.head_share().num_head_positions if layout.sequence_parallel > 1 else n
    logits = head * shape.vocab_size * (c + FP32)
    layer = layout.local_tokens * c * (3 * shape.hidden_size + 2 * shape.q_width + 2 * shape.kv_width
                     + 2 * shape.active_intermediate_size)
    mask = c * layout.num_rows * layout.row_length ** 2 if layout.masked else 0
    return logits + layer + mask


def holds_unsharded_gradients(grad_sync: str, local_mini_batch: int, micro_batch: int) -> bool:
    """Whether FSDP2 keeps the whole model's unsharded gradients between micro-batches: ``grad_sync=step`` with more
    than one micro-batch per optimizer step (``micro_batch`` reduce-scatters each one into the shards)."""
    return grad_sync == "step" and local_mini_batch > micro_batch


def defers_all_reduce(fsdp_size: int, world: int, grad_sync: str, local_mini_batch: int, micro_batch: int,
                      deferred: bool = True) -> bool:
    """Whether HSDP holds reduced gradient shards for its one all-reduce per step (``fsdp.defer_all_reduce``):
    several shard groups, gradients reduce-scattered every micro-batch, more than one micro-batch."""
    return (deferred and shard_group_ranks(fsdp_size, world) < world and grad_sync == "micro_batch"
            and local_mini_batch > micro_batch)


def trained_role(name: str, shape: DecoderShape, layout: ForwardLayout, *, world: int, mode: PrecisionMode,
                 accumulating: bool, checkpointing: bool, param_offload: bool, gather_once: bool = False,
                 deferred_all_reduce: bool = False) -> RoleMemory:
    """An FSDP2-trained role (actor or critic) during its own update: states + one micro-batch's activation peak
    (a value model's activations follow :func:`head_output_shape`). ``deferred_all_reduce``: HSDP reduce-scattering
    every micro-batch keeps the reduced shards until the step's one all-reduce (one more shard of gradients)."""
    precision = Precision(compute_bytes=mode.compute_bytes, master_bytes=mode.master_bytes, grad_bytes=mode.grad_bytes,
                          optimizer_bytes_per_param=mode.optimizer_bytes)
    states = model_state_bytes(shape, world_size=world, precision=precision, accumulating=accumulating,
                               gather_once=gather_once)
    activations = activation_bytes(head_output_shape(name, shape), layout, compute_bytes=mode.compute_bytes,
                                   logits_bytes=FP32, checkpointing=checkpointing).peak
    # Gradients in flight to their reduce-scatter exist only in backward: gradients, not buffers held in every phase.
    pending = states.gradients if deferred_all_reduce else 0
    gradients = states.gradients + states.accumulated_gradients + states.gathered_gradients + pending
    held = "grad_sync=step: unsharded gradients held while accumulating" if states.accumulated_gradients else ""
    if param_offload:  # CPUOffloadPolicy: parameters, gradients and the optimizer step live on the host
        return RoleMemory(name, gradients=states.accumulated_gradients + states.gathered_gradients + pending,
                          activations=activations,
                          buffers=states.gathered, offloaded=states.parameters + states.gradients + states.optimizer,
                          host_parameters=states.parameters,
                          note="; ".join(filter(None, ("FSDP2 param_offload: states on the host", held))))
    return RoleMemory(name, parameters=states.parameters, gradients=gradients, optimizer=states.optimizer,
                      activations=activations, buffers=states.gathered, note=held)


def frozen_role(name: str, shape: DecoderShape, layout: ForwardLayout, *, world: int, compute_bytes: int,
                offload: bool = False) -> RoleMemory:
    """A forward-only role (reference, reward model): fp32 master parameters sharded, one layer gathered."""
    sharded = FP32 * -(-shape.num_parameters() // world)
    gathered = compute_bytes * (shape.root_parameters() + 2 * shape.layer_parameters()) if world > 1 else 0
    activations = forward_only_bytes(head_output_shape(name, shape), layout, compute_bytes)
    if offload:
        return RoleMemory(name, activations=activations, buffers=gathered, offloaded=sharded, note="offloaded",
                          host_parameters=sharded)
    return RoleMemory(name, parameters=sharded, activations=activations, buffers=gathered)


def value_shape(shape: DecoderShape) -> DecoderShape:
    """The parameters of a value/reward model on ``shape``'s backbone: no LM head (a 1-wide head instead, whose
    ``h + 1`` parameters the tied-embedding count leaves out)."""
    return dataclasses.replace(shape, tie_word_embeddings=True)


def head_output_shape(role: str, shape: DecoderShape) -> DecoderShape:
    """The shape whose activations a role produces: value and reward models output ``[N, 1]``, not ``[N, V]``."""
    return dataclasses.replace(shape, vocab_size=1) if role in ("critic", "reward_model") else shape


def kv_bytes_per_token(shape: DecoderShape, compute_bytes: int, tp: int = 1) -> int:
    """KV-cache bytes of one token on one device: keys and values of every layer, KV heads split over TP ranks."""
    return 2 * shape.num_layers * shape.kv_width * compute_bytes // tp


def rollout_role(config: TrainConfig, shape: DecoderShape, device_bytes: int, utilization: float) -> RoleMemory:
    """The generation engine on one device. vLLM: a fixed ``utilization`` share (weights in the compute dtype ÷ TP,
    activation reserve, the rest KV cache). HF: the KV cache of this rank's sequences at full length plus one decode
    step's fp32 logits."""
    c = DTYPE_BYTES[config.model.dtype]
    tp = config.rollout.tensor_model_parallel_size
    kv_per_token = kv_bytes_per_token(shape, c, tp)
    if config.rollout.name == "vllm":
        budget = int(utilization * device_bytes)
        weights = c * shape.num_parameters() // tp
        tokens = config.rollout.max_num_batched_tokens
        reserve = tokens * c * (4 * shape.hidden_size + 2 * shape.active_intermediate_size) + \
            config.rollout.max_num_seqs * shape.vocab_size * FP32
        kv_cache = max(0, budget - weights - reserve)
        buckets = 2 * config.rollout.weight_sync_bucket_mb * 2**20
        beside_actor = colocated_replicas(config)  # its own process on the actor's device: one more CUDA context
        where = ("on the pool's own devices" if config.rollout.n_gpus else
                 "in its own process: + a CUDA context" if beside_actor else "in the actor's process")
        return RoleMemory("rollout (vllm)", parameters=weights, activations=reserve, kv_cache=kv_cache,
                          buffers=buckets + (CUDA_CONTEXT_BYTES if beside_actor else 0), note=f"{where}; gpu_memory_utilization={utilization:g}; "
                                                              f"KV holds {kv_cache // kv_per_token:,} tokens")
    rows = -(-config.data.train_batch_size * config.rollout.n // world_size(config))
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    logits = rows * shape.vocab_size * FP32
    return RoleMemory("rollout (hf)", kv_cache=rows * seq_len * kv_bytes_per_token(shape, c), activations=logits,
                      note=f"{rows} sequences per rank, shares the actor's weights")


# ----------------------------------------------------------------------------------------------------- the job
@dataclass(frozen=True)
class Shapes:
    """Model shapes of the job's roles (critic, reward model and distillation teacher default to the policy's)."""

    policy: DecoderShape
    critic: Optional[DecoderShape] = None
    reward_model: Optional[DecoderShape] = None
    teacher: Optional[DecoderShape] = None


def plan_memory(config: TrainConfig, shapes: Shapes, device_bytes: int, setup: Optional[Setup] = None) -> MemoryPlan:
    """The per-device breakdown and phase totals of ``config`` (with ``setup`` overriding the varied settings)."""
    setup = setup or setup_from(config)
    world, c = world_size(config), DTYPE_BYTES[config.model.dtype]
    fixed = CUDA_CONTEXT_BYTES + (NCCL_BUFFER_BYTES if world > 1 else 0)
    modes = {"actor": precision_mode(config.model.dtype, config.actor.fsdp.reduce_dtype, setup.actor_state_precision,
                                     config.model.fp8_compute)}
    actor_plan = role_plan(config, "actor")
    roles = {"actor": trained_role(
        "actor", shapes.policy, training_layout(config, "actor", setup.actor_micro_batch),
        world=shard_group_ranks(config.actor.fsdp.fsdp_size, world),
        mode=modes["actor"], accumulating=holds_unsharded_gradients(
            setup.actor_grad_sync, actor_plan.local_mini_batch_sequences, setup.actor_micro_batch),
        checkpointing=setup.checkpointing, param_offload=setup.param_offload,
        gather_once=setup.actor_gather_once, deferred_all_reduce=defers_all_reduce(
            config.actor.fsdp.fsdp_size, world, setup.actor_grad_sync, actor_plan.local_mini_batch_sequences,
            setup.actor_micro_batch, setup.actor_defer_all_reduce))}
    log_prob_rows = config.actor.log_prob_micro_batch_size_per_gpu or setup.actor_micro_batch
    forward_layout = training_layout(config, "actor", log_prob_rows)
    if config.actor.use_kl_loss or config.algorithm.use_kl_in_reward:
        roles["ref"] = frozen_role("ref", shapes.policy, forward_layout, compute_bytes=c,
                                   world=shard_group_ranks(config.actor.fsdp.fsdp_size, world),
                                   offload=setup.ref_param_offload)
    if config.algorithm.distillation.teacher_path:  # sharded and offloaded like the reference
        roles["teacher"] = frozen_role("teacher", shapes.teacher or shapes.policy, forward_layout, compute_bytes=c,
                                       world=shard_group_ranks(config.actor.fsdp.fsdp_size, world),
                                       offload=setup.ref_param_offload)
    if critic_enabled(config):
        modes["critic"] = precision_mode(config.model.dtype, config.critic.fsdp.reduce_dtype,
                                         setup.critic_state_precision, config.model.fp8_compute)
        critic_shape = value_shape(shapes.critic or shapes.policy)
        critic_plan = role_plan(config, "critic")
        roles["critic"] = trained_role(
            "critic", critic_shape, training_layout(config, "critic", setup.critic_micro_batch),
            world=shard_group_ranks(config.critic.fsdp.fsdp_size, world),
            mode=modes["critic"], accumulating=holds_unsharded_gradients(
                setup.critic_grad_sync, critic_plan.local_mini_batch_sequences, setup.critic_micro_batch),
            checkpointing=setup.checkpointing, param_offload=setup.critic_param_offload,
            gather_once=setup.critic_gather_once, deferred_all_reduce=defers_all_reduce(
                config.critic.fsdp.fsdp_size, world, setup.critic_grad_sync, critic_plan.local_mini_batch_sequences,
                setup.critic_micro_batch, setup.critic_defer_all_reduce))
    if config.reward_model.enable:
        rm_layout = ForwardLayout.padded(config.reward_model.micro_batch_size_per_gpu, forward_layout.row_length)
        roles["reward_model"] = frozen_role("reward_model", value_shape(shapes.reward_model or shapes.policy),
                                            rm_layout, world=world, compute_bytes=c)
    roles["rollout"] = rollout_role(config, shapes.policy, device_bytes, setup.gpu_memory_utilization)
    roles["buffers"] = RoleMemory("buffers", buffers=fixed, note="CUDA context" + (" + NCCL" if world > 1 else ""))
    pool = config.rollout.n_gpus > 0  # the engines on devices of their own: not on the trainer's
    forward_peak = forward_only_bytes(shapes.policy, forward_layout, c)
    if "teacher" in roles:  # the teacher's forward runs on the actor's workers, after the actor's: the larger
        forward_peak = max(forward_peak, forward_only_bytes(shapes.teacher or shapes.policy, forward_layout, c))
    if "critic" in roles:  # the value forward runs at the same time, on the critic's own workers
        forward_peak += forward_only_bytes(head_output_shape("critic", shapes.critic or shapes.policy),
                                           forward_layout, c)
    phases = phase_totals(roles, setup, config.rollout.free_cache_engine, forward_peak,
                          generates_on_actor=config.rollout.name != "vllm", rollout_here=not pool)
    if pool:  # a pool device holds its engine and its own CUDA context
        phases["generate_on_pool"] = roles["rollout"].total + CUDA_CONTEXT_BYTES
    return MemoryPlan(setup=setup, roles=roles, phases=phases, device_bytes=device_bytes, precision=modes,
                      problems=engine_problems(config, shapes.policy, roles["rollout"], setup.gpu_memory_utilization))


def engine_problems(config: TrainConfig, shape: DecoderShape, rollout: RoleMemory, utilization: float) -> list[str]:
    """vLLM cannot start unless its share holds its weights, its activation reserve and one full sequence's KV."""
    if config.rollout.name != "vllm":
        return []
    one_sequence = (config.data.max_prompt_length + config.data.max_response_length) * kv_bytes_per_token(
        shape, DTYPE_BYTES[config.model.dtype], config.rollout.tensor_model_parallel_size)
    if rollout.kv_cache >= one_sequence:
        return []
    return [f"vLLM's share (rollout.gpu_memory_utilization={utilization:g}) leaves "
            f"{rollout.kv_cache / GIB:.2f} GiB of KV cache, less than one sequence ({one_sequence / GIB:.2f} GiB): "
            "raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size"]


def phase_totals(roles: dict[str, RoleMemory], setup: Setup, free_cache_engine: bool,
                 forward_peak: int, generates_on_actor: bool = True, rollout_here: bool = True) -> dict[str, int]:
    """Device bytes of each phase of the step (module docstring); ``forward_peak``: the no-grad forwards of the
    log-prob phase (actor, and the critic's values at the same time); ``generates_on_actor``: the rollout decodes on
    the actor's own module (HF ``generate``), which holds the actor's gathered parameters meanwhile — a vLLM engine
    has its own weights (in ``roles["rollout"]``), and the actor's kept-gathered copy is released before it runs.
    ``rollout_here=False``: the engines run on a standalone pool's devices, not on these."""
    trained = [name for name in ("actor", "critic") if name in roles]
    frozen = [name for name in ("ref", "teacher", "reward_model") if name in roles]
    resident = sum(roles[name].resident for name in trained + frozen) + roles["buffers"].total
    rollout = roles["rollout"].total if rollout_here else 0
    asleep = 0 if free_cache_engine else rollout
    moved_out = roles["actor"].optimizer if setup.optimizer_offload and not setup.param_offload else 0
    # critic.fsdp.optimizer_offload: the critic's state is on the device in its own update only
    critic_away = roles["critic"].optimizer if "critic" in roles and setup.critic_optimizer_offload else 0
    phases = {"generate": resident - moved_out - critic_away + rollout
              + (roles["actor"].buffers if generates_on_actor else 0)}
    forwards = forward_peak + sum(roles[name].buffers for name in trained)
    phases["log_probs"] = resident - critic_away + asleep + forwards
    for name in trained:
        role = roles[name]
        away = critic_away if name != "critic" else 0
        phases[f"update_{name}"] = resident - away + asleep + role.gradients + role.activations + role.buffers
    return phases
