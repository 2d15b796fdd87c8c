"""Communication of one training step: the bytes each collective moves, the links they cross, and the seconds they
add to the step (``hybridrl plan``).

**Bytes** (per rank and step; the payload is the whole tensor a collective is about, as the updates'
``comm/*_bytes`` metrics count it — :func:`hybridrl.utils.collectives.payload_bytes`):

- FSDP2 all-gathers each group's parameters in the compute dtype in every micro-batch's forward and again in its
  backward (the root's group too), or once per optimizer step and once per forward-only pass with
  ``fsdp.gather_once``; forward-only passes (log-probs, values) gather once per micro-batch otherwise;
- it reduce-scatters the gradients in ``fsdp.reduce_dtype`` once per optimizer step (``fsdp.grad_sync=step``) or
  after every micro-batch (``micro_batch``);
- with HSDP (``fsdp.fsdp_size`` below the ranks) the last reduce-scatter of an optimizer step is followed by one
  all-reduce of the rank's reduced shard across the shard groups (with ``micro_batch`` the earlier ones are kept and
  added in first);
- HF generation (``rollout.name=hf``) gathers the actor's parameters once per call;
- FSDP2 pads every parameter's rows to a multiple of the shard group, and the collectives carry the padding
  (:func:`~hybridrl.autotune.decoder_shape.tensor_elements`); on one rank nothing moves.

Accumulation is where the bytes go: ``K`` micro-batches cost ``2K`` all-gathers per optimizer step (one with
``gather_once``) against one gradient reduction with ``grad_sync=step`` — the reason to accumulate, and the reason
HSDP keeps the all-gathers and reduce-scatters inside a node and sends only one all-reduce per step across nodes.

**Links** (:class:`Topology`): a ring collective over ``n`` ranks sends ``(n − 1)/n`` of the payload from every rank
(an all-reduce twice that). Ranks of a node share its intra-node link (PCIe or NVLink, per GPU); a ring that leaves
the node crosses its network interface, which carries every ring leaving the node at once (the HSDP all-reduce of
each of the node's shards). Presets name datasheet line rates, except PCIe and NVLink: what NCCL reaches on them.

**Time**: FSDP2 overlaps its collectives with compute (the next layer's all-gather during this layer's work, the
reduce-scatter during the next layer's backward), so a micro-batch costs the larger of its compute and its
communication; what communication adds beyond compute is the phase's exposed time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from hybridrl.autotune.decoder_shape import DecoderShape, tensor_elements
from hybridrl.config.precision import DTYPE_BYTES
from hybridrl.config.rollout_placement import generation_devices
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import gathers_once, reuses_update_log_probs, role_plan, shard_group_ranks, world_size
from hybridrl.config.validation import critic_enabled
from hybridrl.planner.memory_plan import training_layout

GBIT = 1e9 / 8


@dataclass(frozen=True)
class Link:
    """A link's usable bandwidth in one direction (bytes/s) and the latency of one small collective over it (s):
    what a tensor-parallel decode step, two all-reduces of a few KiB per layer, pays."""

    name: str
    bytes_per_second: float
    latency_s: float = 50e-6


LINKS: dict[str, Link] = {
    "pcie": Link("PCIe 4.0 x16", 20e9, 25e-6),  # what NCCL reaches between GPUs without NVLink (line 32 GB/s)
    "nvlink3": Link("NVLink 3 (A100)", 240e9, 10e-6),  # NCCL bus bandwidth on 8 x A100 SXM (300 GB/s each way)
    "nvlink4": Link("NVLink 4 (H100/H200)", 360e9, 10e-6),  # the same on Hopper (450 GB/s each way)
    "1gbe": Link("1 Gb Ethernet", 1 * GBIT, 100e-6),
    "10gbe": Link("10 Gb Ethernet", 10 * GBIT, 50e-6),
    "25gbe": Link("25 Gb Ethernet", 25 * GBIT, 50e-6),
    "100gbe": Link("100 Gb Ethernet", 100 * GBIT, 50e-6),
    "ib": Link("InfiniBand HDR 200 Gb/s", 200 * GBIT, 10e-6),
    "ib-ndr": Link("InfiniBand NDR 400 Gb/s", 400 * GBIT, 10e-6),
}
DEFAULT_NETWORK = "25gbe"


def parse_link(text: str) -> Link:
    """A preset name (:data:`LINKS`) or a number of Gbit/s (``"40"``); ``ValueError`` naming the choices otherwise."""
    key = text.strip().lower()
    if key in LINKS:
        return LINKS[key]
    try:
        gigabits = float(key.removesuffix("gbps").removesuffix("gb/s"))
    except ValueError:
        raise ValueError(f"unknown link {text!r}: one of {', '.join(LINKS)} or a number of Gbit/s") from None
    if not gigabits > 0 or math.isinf(gigabits):
        raise ValueError(f"a link's bandwidth must be a positive number of Gbit/s, got {text!r}")
    return Link(f"{gigabits:g} Gb/s", gigabits * GBIT)


@dataclass(frozen=True)
class Topology:
    """Where the job's ranks sit: ``nodes × gpus_per_node``, ranks numbered node by node."""

    nodes: int
    gpus_per_node: int
    intra: Link
    inter: Link

    def ring_seconds(self, payload: float, ranks: int, stride: int, passes: int = 1) -> float:
        """Seconds of a ring collective over ``ranks`` ranks ``stride`` apart (a shard group: 1; HSDP's replicas:
        the group size) moving ``payload`` bytes; ``passes``: 2 for an all-reduce (module docstring)."""
        if ranks <= 1:
            return 0.0
        sent = passes * (ranks - 1) / ranks * payload
        on_node = min(ranks, max(1, self.gpus_per_node // stride))
        seconds = sent / self.intra.bytes_per_second + self.intra.latency_s if on_node > 1 else 0.0
        if on_node < ranks:  # the ring leaves the node: the interface carries every ring that does, at once
            rings = max(1, self.gpus_per_node // on_node)
            seconds = max(seconds, rings * sent / self.inter.bytes_per_second + self.inter.latency_s)
        return seconds

    def crosses_nodes(self, ranks: int, stride: int) -> bool:
        return ranks > 1 and min(ranks, max(1, self.gpus_per_node // stride)) < ranks


@dataclass(frozen=True)
class Collective:
    """``calls`` collectives of one kind per step in one phase, each over ``ranks`` ranks ``stride`` apart:
    ``payload_bytes`` each (the update metrics' ``comm/*_bytes`` sum them), ``seconds`` in all."""

    phase: str
    kind: str  # all_gather | reduce_scatter | fsdp_all_reduce (the engine's payload kinds) | tp_all_reduce
    calls: int
    payload_bytes: int
    ranks: int
    stride: int
    seconds: float
    crosses_nodes: bool

    @property
    def total_bytes(self) -> int:
        return self.calls * self.payload_bytes


@dataclass(frozen=True)
class ShardLayout:
    """How one role's model is sharded and stepped: FSDP2 over ``shard_group`` ranks, ``replicas`` copies (HSDP),
    ``optimizer_steps`` per training step of ``micro_batches`` each."""

    shard_group: int
    replicas: int
    optimizer_steps: int
    micro_batches: int
    gather_once: bool
    grad_sync: str
    compute_bytes: int
    reduce_bytes: int
    defer_all_reduce: bool = True


@dataclass(frozen=True)
class CommPlan:
    """Every collective of the step, and the phases' seconds once communication is overlapped with compute."""

    topology: Topology
    collectives: list[Collective]

    def phase_bytes(self, phase: str, kind: Optional[str] = None) -> int:
        return sum(c.total_bytes for c in self.collectives if c.phase == phase and kind in (None, c.kind))

    def phase_seconds(self, phase: str) -> float:
        return sum(c.seconds for c in self.collectives if c.phase == phase)


def gathered_elements(shape: DecoderShape, shard_group: int, head: str = "lm") -> int:
    """Elements of one all-gather of the whole model over ``shard_group`` ranks, FSDP2's row padding included."""
    sparse = shape.num_sparse_layers if shape.is_moe else 0
    layers = (sparse * tensor_elements(shape.layer_tensors(sparse=True), shard_group)
              + (shape.num_layers - sparse) * tensor_elements(shape.layer_tensors(sparse=False), shard_group))
    return layers + tensor_elements(shape.root_tensors(head), shard_group)


def update_collectives(phase: str, shape: DecoderShape, layout: ShardLayout, topology: Topology,
                       head: str = "lm") -> list[Collective]:
    """The collectives of one role's updates in a step (module docstring); none on a single unsharded rank."""
    group, replicas = layout.shard_group, layout.replicas
    if group <= 1 and replicas <= 1:
        return []
    elements = gathered_elements(shape, group, head)
    steps, k = layout.optimizer_steps, layout.micro_batches
    syncs = steps * (k if layout.grad_sync == "micro_batch" else 1)
    found = []
    if group > 1:
        gathers = steps * (1 if layout.gather_once else 2 * k)
        found.append(_collective(phase, "all_gather", gathers, elements * layout.compute_bytes, group, 1, topology))
        found.append(_collective(phase, "reduce_scatter", syncs, elements * layout.reduce_bytes, group, 1, topology))
    if replicas > 1:  # once per optimizer step (hybridrl.modeling.fsdp.set_gradient_sync), or after every reduction
        shard = elements // group * layout.reduce_bytes
        calls = steps if layout.defer_all_reduce else syncs
        found.append(_collective(phase, "fsdp_all_reduce", calls, shard, replicas, group, topology, passes=2))
    return found


def forward_collectives(phase: str, shape: DecoderShape, layout: ShardLayout, passes: int, topology: Topology,
                        head: str = "lm") -> list[Collective]:
    """The all-gathers of ``passes`` forward-only passes over this rank's rows (``layout.micro_batches`` each)."""
    if layout.shard_group <= 1 or passes == 0:
        return []
    gathers = passes * (1 if layout.gather_once else layout.micro_batches)
    payload = gathered_elements(shape, layout.shard_group, head) * layout.compute_bytes
    return [_collective(phase, "all_gather", gathers, payload, layout.shard_group, 1, topology)]


def sequence_parallel_payloads(shape: DecoderShape, rows: int, length: int, sp: int,
                               compute_bytes: int) -> tuple[list[int], int]:
    """One forward's Ulysses exchanges on a rank (:mod:`hybridrl.modeling.ulysses`): the payloads of each layer's
    all-to-alls — queries, keys, values (KV heads repeated to a multiple of ``sp``) and the attention output, each
    this rank's positions × all heads — and of the gather of the last layer's output (``rows`` rows padded to a
    multiple of ``sp``, every position). The backward repeats each all-to-all and all-reduces the gather's size."""
    local = rows * -(-length // sp)
    kv_heads = shape.num_kv_heads * (sp // math.gcd(shape.num_kv_heads, sp))
    q, kv = local * shape.q_width * compute_bytes, local * kv_heads * shape.head_dim * compute_bytes
    return [q, kv, kv, q], rows * -(-length // sp) * sp * shape.hidden_size * compute_bytes


def sequence_parallel_collectives(phase: str, shape: DecoderShape, *, rows: int, length: int, sp: int,
                                  forwards: int, backwards: int, checkpointing: bool, compute_bytes: int,
                                  topology: Topology) -> list[Collective]:
    """The exchanges of ``forwards`` forward passes of ``rows × length`` tokens split over ``sp`` neighbouring ranks,
    ``backwards`` of them with a backward (activation checkpointing recomputes each layer's forward, and with it
    its all-to-alls, once more). Worst case: full-length rows; kind ``sequence_parallel``
    as the engine's ``comm/sequence_parallel_bytes``."""
    if sp <= 1 or forwards == 0:
        return []
    exchanges, gathered = sequence_parallel_payloads(shape, rows, length, sp, compute_bytes)
    layer_forwards = forwards + (backwards if checkpointing else 0)
    found = [_collective(phase, "sequence_parallel", (layer_forwards + backwards) * shape.num_layers, payload, sp, 1,
                         topology) for payload in exchanges]
    # the gather follows the last saved tensor of the last layer: a recomputation stops before it (torch's
    # non-reentrant checkpoint recomputes only until it has what the backward needs)
    found.append(_collective(phase, "sequence_parallel", forwards, gathered, sp, 1, topology))
    if backwards:  # the gather's backward: an all-reduce of its gradient
        found.append(_collective(phase, "sequence_parallel", backwards, gathered, sp, 1, topology, passes=2))
    return found


def _collective(phase: str, kind: str, calls: int, payload: int, ranks: int, stride: int, topology: Topology,
                passes: int = 1) -> Collective:
    return Collective(phase, kind, calls, payload, ranks, stride,
                      calls * topology.ring_seconds(payload, ranks, stride, passes),
                      topology.crosses_nodes(ranks, stride))


def shard_layout(config: TrainConfig, role: str, *, micro_batch: Optional[int] = None,
                 gather_once: Optional[bool] = None, grad_sync: Optional[str] = None,
                 defer_all_reduce: Optional[bool] = None) -> ShardLayout:
    """``role``'s (``actor`` / ``critic``) sharding and stepping from ``config``, with the planner's varied settings
    overriding it (a token budget counts ``⌈tokens ÷ budget⌉`` micro-batches of full-length rows)."""
    role_config, world = getattr(config, role), world_size(config)
    plan = role_plan(config, role)
    local = plan.local_mini_batch_sequences
    if role_config.use_dynamic_bsz:
        seq_len = config.data.max_prompt_length + config.data.max_response_length
        budget = role_config.ppo_max_token_len_per_gpu * role_config.ulysses_sequence_parallel_size  # a SP group's
        micro_batches = max(1, -(-local * seq_len // budget))
    else:
        size = micro_batch or plan.micro_batch_size_per_gpu or 1
        micro_batches = max(1, local // size)
    group = shard_group_ranks(role_config.fsdp.fsdp_size, world)
    once = gathers_once(role_config.fsdp.gather_once, "cuda", world) if gather_once is None else gather_once
    return ShardLayout(shard_group=group, replicas=world // group,
                       optimizer_steps=plan.num_mini_batches * role_config.ppo_epochs, micro_batches=micro_batches,
                       gather_once=once, grad_sync=grad_sync or role_config.fsdp.grad_sync,
                       compute_bytes=DTYPE_BYTES[config.model.dtype],
                       reduce_bytes=DTYPE_BYTES[role_config.fsdp.reduce_dtype],
                       defer_all_reduce=(role_config.fsdp.defer_all_reduce if defer_all_reduce is None
                                         else defer_all_reduce))


def micro_batch_comm_seconds(layout: ShardLayout, update: list[Collective]) -> list[float]:
    """Seconds of communication in each micro-batch of one optimizer step of ``update`` (its collectives): the
    all-gathers every micro-batch (the first only, with ``gather_once``), the gradient reduction after every one
    (``grad_sync=micro_batch``) or the last."""
    per_call = {c.kind: c.seconds / c.calls for c in update if c.calls}
    gather, reduce = per_call.get("all_gather", 0.0), per_call.get("reduce_scatter", 0.0)
    all_reduce = per_call.get("fsdp_all_reduce", 0.0)
    k = layout.micro_batches
    return [(gather if layout.gather_once and i == 0 else 0.0 if layout.gather_once else 2 * gather)
            + (reduce if layout.grad_sync == "micro_batch" or i == k - 1 else 0.0)
            + (all_reduce if i == k - 1 or (not layout.defer_all_reduce and layout.grad_sync == "micro_batch")
               else 0.0) for i in range(k)]


def overlapped_seconds(compute: float, layout: ShardLayout, update: list[Collective]) -> float:
    """An update phase's seconds when each micro-batch costs the larger of its compute (``compute`` spread evenly
    over the step's micro-batches) and its communication; plus the exchanges nothing overlaps."""
    schedule = micro_batch_comm_seconds(layout, update)
    each = compute / (layout.optimizer_steps * len(schedule))
    return layout.optimizer_steps * sum(max(each, comm) for comm in schedule) + serial_seconds(update)


def serial_seconds(collectives: list[Collective]) -> float:
    """Seconds of the collectives that compute waits for: sequence parallelism's exchanges sit between a layer's
    projections and its attention (and the gather between the layers and the head)."""
    return sum(c.seconds for c in collectives if c.kind == "sequence_parallel")


@dataclass(frozen=True)
class StepComm:
    """A step's communication: every collective, the layouts of the trained roles, and each phase's seconds with
    communication overlapped (``phases``) beside its compute alone (``compute``)."""

    plan: CommPlan
    layouts: dict[str, ShardLayout]
    phases: dict[str, float]
    compute: dict[str, float]
    forward_gathers: int = 1
    """All-gathers of one forward-only pass of the policy (its micro-batches, or 1 with ``gather_once``)."""

    def exposed(self, phase: str) -> float:
        """What communication adds to ``phase`` beyond its compute."""
        return self.phases[phase] - self.compute[phase]


def plan_communication(config: TrainConfig, shapes, topology: Topology, compute: dict[str, float],
                       setup=None) -> StepComm:
    """The collectives of one step of ``config`` (``shapes``: the planner's :class:`~hybridrl.planner.memory_plan.
    Shapes`; ``setup``: its varied settings, else the config's) and each phase's seconds once ``compute`` (the
    roofline's seconds per phase) is overlapped with them."""
    layouts = {"actor": _setup_layout(config, "actor", setup)}
    collectives = update_collectives("update_actor", shapes.policy, layouts["actor"], topology)
    forward = forward_layout(config, "actor", layouts["actor"])
    passes = (0 if reuses_update_log_probs(config) else 1) + (config.actor.use_kl_loss
                                                              or config.algorithm.use_kl_in_reward)
    collectives += forward_collectives("log_probs", shapes.policy, forward, passes, topology)
    if critic_enabled(config):
        critic_shape = shapes.critic or shapes.policy
        layouts["critic"] = _setup_layout(config, "critic", setup)
        collectives += update_collectives("update_critic", critic_shape, layouts["critic"], topology, head="value")
        collectives += forward_collectives("log_probs", critic_shape, forward_layout(config, "critic", layouts["critic"]),
                                           1, topology, head="value")
    collectives += split_sequence_collectives(config, shapes, layouts, passes, topology)
    collectives += tensor_parallel_collectives(config, shapes.policy, topology)
    if config.rollout.name == "hf":  # HF generate on the actor's own module: gathered once per call
        collectives += forward_collectives("generate", shapes.policy, replace(forward, gather_once=True), 1, topology)
    plan = CommPlan(topology, collectives)
    phases = dict(compute)
    if "generate" in phases:  # on the decode's critical path: nothing to overlap with
        phases["generate"] = compute["generate"] + plan.phase_seconds("generate")
    for role, layout in layouts.items():
        phase = f"update_{role}"
        if phase in phases:
            update = [c for c in collectives if c.phase == phase]
            phases[phase] = overlapped_seconds(compute[phase], layout, update)
    if "log_probs" in phases:  # forward-only passes: the all-gathers run under the forwards' compute
        passes = [c for c in collectives if c.phase == "log_probs"]
        serial = serial_seconds(passes)
        phases["log_probs"] = max(compute["log_probs"], plan.phase_seconds("log_probs") - serial) + serial
    return StepComm(plan, layouts, phases, dict(compute), 1 if forward.gather_once else forward.micro_batches)


def split_sequence_collectives(config: TrainConfig, shapes, layouts: dict[str, ShardLayout], actor_passes: int,
                               topology: Topology) -> list[Collective]:
    """The Ulysses exchanges of the roles that split sequences (``*.ulysses_sequence_parallel_size``): their updates
    and their forward-only passes (``actor_passes`` of the actor's: old log-probs, reference; one of the critic's)."""
    found = []
    for role, layout in layouts.items():
        sp = getattr(config, role).ulysses_sequence_parallel_size
        if sp <= 1:
            continue
        shape = (shapes.critic or shapes.policy) if role == "critic" else shapes.policy
        plan = role_plan(config, role)
        common = dict(sp=sp, compute_bytes=layout.compute_bytes, topology=topology)
        steps = layout.optimizer_steps * layout.micro_batches
        found += sequence_parallel_collectives(
            f"update_{role}", shape, **_micro_batch_rows(config, role, plan.local_mini_batch_sequences, layout),
            forwards=steps, backwards=steps, checkpointing=config.model.enable_gradient_checkpointing, **common)
        forward = forward_layout(config, role, layout)
        passes = actor_passes if role == "actor" else 1
        found += sequence_parallel_collectives(
            "log_probs", shape, **_micro_batch_rows(config, role, plan.local_mini_batch_sequences * plan.num_mini_batches,
                                                    forward),
            forwards=passes * forward.micro_batches, backwards=0, checkpointing=False, **common)
    return found


def _micro_batch_rows(config: TrainConfig, role: str, rows: int, layout: ShardLayout) -> dict[str, int]:
    """The worst-case ``rows × length`` a micro-batch of ``role`` runs (its share of ``rows`` full-length rows),
    as the memory plan lays it out (:func:`~hybridrl.planner.memory_plan.training_layout`)."""
    forward = training_layout(config, role, -(-rows // layout.micro_batches))
    return dict(rows=forward.num_rows, length=forward.row_length)


def tensor_parallel_collectives(config: TrainConfig, shape: DecoderShape, topology: Topology) -> list[Collective]:
    """vLLM's tensor-parallel all-reduces (two a layer: after attention and after the MLP) of the hidden states of
    its rows, in the prefill (``[rows × prompt, h]``) and in each decode step (``[rows, h]``): a replica's ``t``
    ranks are neighbours in a node."""
    tp = config.rollout.tensor_model_parallel_size
    if tp <= 1 or config.rollout.name != "vllm":
        return []
    rows = -(-config.data.train_batch_size * config.rollout.n * tp // generation_devices(config))
    per_row = shape.hidden_size * DTYPE_BYTES[config.model.dtype]
    calls = 2 * shape.num_layers
    return [_collective("generate", "tp_all_reduce", calls, rows * config.data.max_prompt_length * per_row, tp, 1,
                        topology, passes=2),
            _collective("generate", "tp_all_reduce", calls * config.data.max_response_length, rows * per_row, tp, 1,
                        topology, passes=2)]


def _setup_layout(config: TrainConfig, role: str, setup) -> ShardLayout:
    if setup is None:
        return shard_layout(config, role)
    return shard_layout(config, role, micro_batch=getattr(setup, f"{role}_micro_batch"),
                        gather_once=getattr(setup, f"{role}_gather_once"),
                        grad_sync=getattr(setup, f"{role}_grad_sync"),
                        defer_all_reduce=getattr(setup, f"{role}_defer_all_reduce"))


def forward_layout(config: TrainConfig, role: str, update: ShardLayout) -> ShardLayout:
    """``update`` with the micro-batches of ``role``'s forward-only pass over this rank's rows of the step: its
    ``log_prob_micro_batch_size_per_gpu`` where it has one, else the update's micro-batch."""
    plan = role_plan(config, role)
    rows = plan.local_mini_batch_sequences * plan.num_mini_batches
    size = (getattr(getattr(config, role), "log_prob_micro_batch_size_per_gpu", None)
            or max(1, plan.local_mini_batch_sequences // update.micro_batches))
    return replace(update, micro_batches=max(1, -(-rows // size)))
