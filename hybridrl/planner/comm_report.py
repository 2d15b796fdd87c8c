"""``hybridrl plan``'s communication section: the step's collectives over the job's links, and how the step time
moves with accumulation (1 / 8 / 32 micro-batches per optimizer step) and with HSDP against full sharding."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import role_plan
from hybridrl.planner.comm_plan import DEFAULT_NETWORK, LINKS, Collective, Link, StepComm, Topology, plan_communication
from hybridrl.planner.memory_plan import Setup, Shapes, plan_memory
from hybridrl.planner.search import with_shard_groups

GIB = 2**30
ACCUMULATION_STEPS = (1, 8, 32)


@dataclass(frozen=True)
class Variant:
    """One row of a what-if table: a label, its step's communication and whether its memory fits."""

    label: str
    comm: StepComm
    fits: bool

    @property
    def step_seconds(self) -> float:
        return sum(self.comm.phases.values())

    @property
    def step_bytes(self) -> int:
        return sum(c.total_bytes for c in self.comm.plan.collectives)

    @property
    def crossing_bytes(self) -> int:
        return sum(c.total_bytes for c in self.comm.plan.collectives if c.crosses_nodes)


def topology_of(config, node_link: Link, network: Link) -> Topology:
    """The job's nodes and links (any trainer's config: ``trainer.nnodes`` × ``trainer.n_gpus_per_node``)."""
    return Topology(config.trainer.nnodes, config.trainer.n_gpus_per_node, node_link, network)


def assumed_network(config, network: Optional[Link]) -> Optional[str]:
    """The default network's name when a job of several nodes was planned without ``--network``, else ``None``."""
    return LINKS[DEFAULT_NETWORK].name if network is None and config.trainer.nnodes > 1 else None


def collective_line(c: Collective) -> str:
    """One collective of a step: phase, kind, calls × payload, ranks, where, seconds."""
    where = "crosses nodes" if c.crosses_nodes else "in a node"
    return (f"  {c.phase:<20}{c.kind:<16}{c.calls:>5} x {c.payload_bytes / GIB:7.3f} GiB over {c.ranks} ranks "
            f"({where}): {c.seconds:8.2f} s")


def accumulation_variants(config: TrainConfig, shapes: Shapes, topology: Topology, compute: dict[str, float],
                          setup: Setup, device_bytes: int, headroom: float) -> list[Variant]:
    """The step at 1, 8 and 32 micro-batches per optimizer step (the actor's and the critic's micro-batch set to
    divide their per-rank mini-batch so), where the mini-batch allows it."""
    variants = []
    for steps in ACCUMULATION_STEPS:
        sizes = {}
        for role in ("actor", "critic"):
            local = role_plan(config, role).local_mini_batch_sequences
            if local % steps == 0:
                sizes[f"{role}_micro_batch"] = local // steps
        if "actor_micro_batch" not in sizes or config.actor.use_dynamic_bsz:
            continue
        varied = dataclasses.replace(setup, **sizes)
        fits = plan_memory(config, shapes, device_bytes, varied).fits(headroom)
        label = f"accumulation {steps:>2} (micro-batch {sizes['actor_micro_batch']})"
        variants.append(Variant(label, plan_communication(config, shapes, topology, compute, varied), fits))
    return variants


def sharding_variants(config: TrainConfig, shapes: Shapes, topology: Topology, compute: dict[str, float],
                      setup: Setup, device_bytes: int, headroom: float) -> list[Variant]:
    """HSDP (shard within each node, replicate across nodes) against full sharding over every rank, on a job of
    several nodes."""
    if config.trainer.nnodes <= 1:
        return []
    variants = []
    for size, label in ((config.trainer.n_gpus_per_node, "HSDP: shard in a node, replicate across"),
                        (-1, "full shard over every rank")):
        varied = with_shard_groups(config, size, size)
        fits = plan_memory(varied, shapes, device_bytes, setup).fits(headroom)
        variants.append(Variant(label, plan_communication(varied, shapes, topology, compute, setup), fits))
    return variants


def collective_lines(comm: StepComm) -> list[str]:
    """One line per phase and kind of collective: calls, bytes, the link, seconds."""
    topology = comm.plan.topology
    lines = [f"communication ({topology.nodes} node(s) x {topology.gpus_per_node} GPUs; in a node "
             f"{topology.intra.name} {topology.intra.bytes_per_second / 1e9:.3g} GB/s, between nodes "
             f"{topology.inter.name} {topology.inter.bytes_per_second / 1e9:.3g} GB/s per node):"]
    if not comm.plan.collectives:
        return lines + ["  none: one rank shards nothing"]
    lines += [collective_line(c) for c in comm.plan.collectives]
    exposed = ", ".join(f"{phase} +{comm.exposed(phase):.2f} s" for phase in comm.phases
                        if comm.exposed(phase) > 0.005)
    lines.append("  beyond compute (overlapped as FSDP2 does): " + (exposed or "nothing"))
    return lines


def variant_lines(title: str, variants: list[Variant]) -> list[str]:
    if not variants:
        return []
    lines = [title]
    for variant in variants:
        fits = "" if variant.fits else "  (does not fit in memory)"
        lines.append(f"  {variant.label:<44} step {variant.step_seconds:9.2f} s; {variant.step_bytes / GIB:9.2f} GiB "
                     f"moved per rank, {variant.crossing_bytes / GIB:9.2f} GiB of it across nodes{fits}")
    return lines


def comm_section(config: TrainConfig, shapes: Shapes, comm: StepComm, setup: Setup, device_bytes: int,
                 headroom: float, network_assumed: Optional[str]) -> list[str]:
    """The whole section: collectives, then the accumulation and sharding tables."""
    lines = collective_lines(comm)
    if network_assumed:
        lines.append(f"  (assumed {network_assumed} between nodes: pass --network to change it)")
    compute, topology = comm.compute, comm.plan.topology
    lines += variant_lines("accumulation (the same global batch; compute and communication):", accumulation_variants(
        config, shapes, topology, compute, setup, device_bytes, headroom))
    lines += variant_lines("sharding (compute and communication):", sharding_variants(config, shapes, topology, compute, setup, device_bytes,
                                                          headroom))
    return lines
