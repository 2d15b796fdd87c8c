"""The text ``hybridrl plan`` prints for a reward-model job (:mod:`hybridrl.planner.rm_plan`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.planner.comm_plan import Topology
from hybridrl.planner.hardware import GpuSpec
from hybridrl.planner.comm_report import ACCUMULATION_STEPS, assumed_network, collective_line, topology_of
from hybridrl.planner.rm_plan import RMPlan, overrides, plan_rm, rm_world, search_rm, setup_of

GIB = 2**30


def _role_lines(plan: RMPlan, device_bytes: int, headroom: float) -> list[str]:
    role = plan.role
    lines = [f"  reward model: parameters {role.parameters / GIB:.2f}, gradients {role.gradients / GIB:.2f}, "
             f"optimizer {role.optimizer / GIB:.2f}, activations {role.activations / GIB:.2f}, buffers "
             f"{(role.buffers + plan.fixed_bytes) / GIB:.2f} GiB" + (f"  [{role.note}]" if role.note else "")
             + (f"  (+{role.offloaded / GIB:.2f} GiB on the host)" if role.offloaded else "")]
    fits = plan.peak_bytes <= device_bytes * (1 - headroom)
    lines.append(f"  peak {plan.peak_bytes / GIB:.2f} GiB of {device_bytes / GIB:.2f} "
                 f"({plan.peak_bytes / device_bytes:.0%}) -> {'FITS' if fits else 'DOES NOT FIT'} with "
                 f"{headroom:.0%} headroom; micro-batch {plan.setup.micro_batch} pairs x accumulation "
                 f"{plan.layout.micro_batches}; step {plan.seconds:.2f} s (compute {plan.compute_seconds:.2f} s)")
    return lines


def format_rm_plan(config, shape: DecoderShape, gpu: GpuSpec, topology: Topology, *, headroom: float = 0.15,
                   efficiency: float = 0.4, network_assumed: Optional[str] = None) -> tuple[str, bool]:
    """The report and whether a setup fits."""
    configured = setup_of(config)
    lines = [f"hybridrl plan (reward model): {rm_world(config)} x {gpu.name} ({gpu.memory_bytes / GIB:.1f} GiB each), "
             f"{config.data.train_batch_size} pairs per optimizer step, {shape.num_parameters() / 1e9:.2f} B "
             f"parameters, headroom {headroom:.0%}", "as configured:"]
    lines += _role_lines(plan_rm(config, shape, gpu, topology, configured, efficiency), gpu.memory_bytes, headroom)
    candidates = search_rm(config, shape, gpu, topology, headroom, efficiency)
    if not candidates:
        lines.append("recommendation: does not fit with any saver: shard over more GPUs, shorten "
                     "data.max_prompt_length / max_response_length, or pick a larger GPU")
        return "\n".join(lines), False
    best = candidates[0]
    changed = overrides(configured, best.setup)
    lines.append("recommendation: " + ("fits as configured" if not changed else "fastest setup that fits"))
    if changed:
        lines.append("  overrides: " + " ".join(changed))
    lines += _role_lines(best, gpu.memory_bytes, headroom)
    if len(candidates) > 1:
        runner_up = candidates[1]
        lines.append(f"  runner-up: {' '.join(overrides(configured, runner_up.setup)) or 'as configured'} -> step "
                     f"{runner_up.seconds:.2f} s, peak {runner_up.peak_bytes / GIB:.2f} GiB")
    lines += _collective_lines(best, topology, network_assumed)
    lines += _accumulation_lines(config, shape, gpu, topology, best, efficiency, headroom)
    lines += _sharding_lines(config, shape, gpu, topology, best, efficiency, headroom)
    return "\n".join(lines), True


def _collective_lines(plan: RMPlan, topology: Topology, network_assumed: Optional[str]) -> list[str]:
    lines = [f"communication (in a node {topology.intra.name}, between nodes {topology.inter.name}"
             + (", assumed: pass --network" if network_assumed else "") + "):"]
    return lines + ([collective_line(c) for c in plan.collectives] or ["  none: one rank shards nothing"])


def _sharding_lines(config, shape, gpu, topology, best: RMPlan, efficiency: float, headroom: float) -> list[str]:
    """HSDP (shard in a node, replicate across) against full sharding, on several nodes."""
    if config.trainer.nnodes <= 1:
        return []
    lines = ["sharding (the chosen savers and micro-batch):"]
    for size, label in ((config.trainer.n_gpus_per_node, "HSDP: shard in a node, replicate across"),
                        (-1, "full shard over every rank")):
        plan = plan_rm(config, shape, gpu, topology, dataclasses.replace(best.setup, fsdp_size=size), efficiency)
        crossing = sum(c.total_bytes for c in plan.collectives if c.crosses_nodes)
        fits = "" if plan.peak_bytes <= gpu.memory_bytes * (1 - headroom) else "  (does not fit in memory)"
        lines.append(f"  {label:<44} step {plan.seconds:9.2f} s; {crossing / GIB:8.2f} GiB across nodes per rank{fits}")
    return lines


def _accumulation_lines(config, shape, gpu, topology, best: RMPlan, efficiency: float, headroom: float) -> list[str]:
    local = config.data.train_batch_size // rm_world(config)
    lines = ["accumulation (the same global batch, the chosen savers):"]
    for steps in ACCUMULATION_STEPS:
        if local % steps:
            continue
        plan = plan_rm(config, shape, gpu, topology, dataclasses.replace(best.setup, micro_batch=local // steps),
                       efficiency)
        moved = sum(c.total_bytes for c in plan.collectives)
        fits = "" if plan.peak_bytes <= gpu.memory_bytes * (1 - headroom) else "  (does not fit in memory)"
        lines.append(f"  accumulation {steps:>2} (micro-batch {local // steps} pairs)   step {plan.seconds:9.2f} s; "
                     f"{moved / GIB:8.2f} GiB moved per rank{fits}")
    return lines


def plan_other_trainer(config, args, by_flags, links: dict) -> int:
    """``hybridrl plan`` given a reward-model config (another trainer's is refused, naming what is planned)."""
    from hybridrl.config.rm_schema import RMConfig
    from hybridrl.planner.comm_plan import DEFAULT_NETWORK, LINKS
    from hybridrl.planner.hardware import gpu_spec
    from hybridrl.planner.known_models import model_shape

    if not isinstance(config, RMConfig):
        raise ValueError(f"hybridrl plan sizes RL jobs (hybridrl train) and reward-model jobs (hybridrl rm); "
                         f"a {type(config).__name__} is not planned yet")
    gpu = gpu_spec(args.gpu)
    shape = by_flags[0] if by_flags else model_shape(config.model.path, "model.path", config.model.trust_remote_code)
    network = links.get("network")
    topology = topology_of(config, links.get("node_link") or LINKS[gpu.node_link], network or LINKS[DEFAULT_NETWORK])
    text, fits = format_rm_plan(config, shape, gpu, topology, headroom=args.headroom, efficiency=args.efficiency,
                                network_assumed=assumed_network(config, network))
    if by_flags:
        print(f"model shape from flags: {shape.num_parameters() / 1e9:.2f} B parameters; assumed "
              + ("; ".join(by_flags[1]) or "nothing"))
    print(text)
    return 0 if fits else 1
