"""``hybridrl plan``: the job's per-device memory, the recommendation, the roofline time and the cost, as text."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Optional

from hybridrl.config.precision import standard_modes
from hybridrl.config.schema import TrainConfig
from hybridrl.planner.comm_plan import DEFAULT_NETWORK, LINKS, Link, StepComm, plan_communication
from hybridrl.planner.comm_report import assumed_network, comm_section, topology_of
from hybridrl.autotune.decoder_shape import DecoderShape
from hybridrl.planner.hardware import GpuSpec
from hybridrl.planner.known_models import model_shape
from hybridrl.planner.memory_plan import MemoryPlan, Setup, Shapes, plan_memory
from hybridrl.planner.recommendation import Recommendation, recommend
from hybridrl.planner.search import Candidate, search
from hybridrl.planner.time_plan import StepTime, generation_waves, job_devices, roofline_step_time, run_cost

GIB = 2**30
COLUMNS = ("parameters", "gradients", "optimizer", "activations", "kv_cache", "buffers")


@dataclass(frozen=True)
class JobPlan:
    """Everything ``hybridrl plan`` prints: the config as given, the recommendation, and the step time."""

    gpu: GpuSpec
    as_configured: MemoryPlan
    recommendation: Recommendation
    step_time: StepTime
    total_steps: Optional[int]
    headroom: float
    price_per_gpu_hour: Optional[float] = None
    comm: Optional[StepComm] = None
    network_assumed: Optional[str] = None

    @property
    def hours(self) -> Optional[float]:
        return None if self.total_steps is None else self.step_time.total * self.total_steps / 3600

    @property
    def cost(self) -> Optional[float]:
        if self.hours is None or self.price_per_gpu_hour is None:
            return None
        return run_cost(self.hours, self.num_devices, self.price_per_gpu_hour)

    num_devices: int = 1
    shapes: Optional[Shapes] = None
    timed_config: Optional[TrainConfig] = None
    """The config of the layout the step was timed for (the recommendation's TP size and sharding, or the config as
    given when nothing fits), with ``timed_setup`` its varied settings."""
    timed_setup: Optional[Setup] = None
    candidates: list[Candidate] = field(default_factory=list)


def shapes_of(config: TrainConfig, policy: Optional[DecoderShape] = None) -> Shapes:
    """Model shapes from the local ``config.json`` of each of the job's models (no weights are read, nothing is
    downloaded), or a known model's published shape (:mod:`hybridrl.planner.known_models`); ``policy``: the policy's
    given instead (``hybridrl plan --layers …``)."""
    remote = config.model.trust_remote_code
    return Shapes(policy=policy or model_shape(config.model.path, "model.path", remote),
                  critic=model_shape(config.critic.model_path, "critic.model_path", remote),
                  reward_model=model_shape(config.reward_model.model_path if config.reward_model.enable else None,
                                           "reward_model.model_path", remote),
                  teacher=model_shape(config.algorithm.distillation.teacher_path,
                                      "algorithm.distillation.teacher_path", remote))


def plan_job(config: TrainConfig, gpu: GpuSpec, *, shapes: Optional[Shapes] = None, headroom: float = 0.15,
             efficiency: float = 0.4, price_per_gpu_hour: Optional[float] = None,
             total_steps: Optional[int] = None, network: Optional[Link] = None,
             node_link: Optional[Link] = None, keep_layout: bool = False) -> JobPlan:
    """Plan ``config`` on ``gpu``: memory as configured, the fastest layout that fits
    (:func:`~hybridrl.planner.search.search`) with its step time — roofline compute, the communication over
    ``node_link`` (default: the GPU's) and ``network`` between nodes (default
    :data:`~hybridrl.planner.comm_plan.DEFAULT_NETWORK`, stated as assumed on a job of several nodes), host copies —
    and the cost. When nothing fits, the saver ladder's verdict (:func:`recommend`) and the configured layout's
    time. ``keep_layout``: search savers and micro-batches only, in the configured TP size and sharding."""
    shapes = shapes or shapes_of(config)
    as_configured = plan_memory(config, shapes, gpu.memory_bytes)
    assumed = assumed_network(config, network)
    topology = topology_of(config, node_link or LINKS[gpu.node_link], network or LINKS[DEFAULT_NETWORK])
    candidates = search(config, shapes, gpu, topology, headroom=headroom, efficiency=efficiency,
                        keep_layout=keep_layout)
    if candidates:
        best = candidates[0]
        advice = Recommendation(True, best.memory, best.overrides, best.fitted.decisions, best.reason)
        comm, phases, timed_config, setup = best.comm, best.phases, best.config, best.memory.setup
    else:
        advice = recommend(config, shapes, gpu.memory_bytes, headroom)
        compute = roofline_step_time(config, shapes.policy, gpu, efficiency=efficiency,
                                     waves=generation_waves(config, shapes.policy, as_configured))
        comm = plan_communication(config, shapes, topology, compute.phases, as_configured.setup)
        phases, timed_config, setup = comm.phases, config, as_configured.setup
    return JobPlan(gpu=gpu, as_configured=as_configured, recommendation=advice,
                   step_time=StepTime(phases, efficiency), total_steps=total_steps or config.trainer.total_training_steps,
                   headroom=headroom, price_per_gpu_hour=price_per_gpu_hour, num_devices=job_devices(config),
                   comm=comm, network_assumed=assumed, shapes=shapes, timed_config=timed_config,
                   timed_setup=setup, candidates=candidates)


def _gib(value: float) -> str:
    return f"{value / GIB:7.2f}"


def memory_table(plan: MemoryPlan) -> list[str]:
    lines = [f"  {'role (GiB per device)':<24}" + "".join(f"{name:>12}" for name in COLUMNS) + f"{'total':>10}"]
    for role in plan.roles.values():
        cells = "".join(f"{_gib(getattr(role, name)):>12}" for name in COLUMNS)
        suffix = f"  [{role.note}]" if role.note else ""
        if role.offloaded:
            suffix += f"  (+{role.offloaded / GIB:.2f} GiB on the host)"
        lines.append(f"  {role.role:<24}{cells}{_gib(role.total):>10}{suffix}")
    usable = plan.device_bytes
    phases = ", ".join(f"{name} {value / GIB:.2f}" for name, value in plan.phases.items())
    lines.append(f"  phases (GiB): {phases}; peak {plan.peak_phase} = {plan.peak_bytes / GIB:.2f} GiB of "
                 f"{usable / GIB:.2f} ({plan.peak_bytes / usable:.0%})")
    return lines


def format_plan(job: JobPlan) -> str:
    """The text ``hybridrl plan`` prints."""
    plan, advice, gpu = job.as_configured, job.recommendation, job.gpu
    lines = [f"hybridrl plan: {job.num_devices} x {gpu.name} ({gpu.memory_bytes / GIB:.1f} GiB each), "
             f"headroom {job.headroom:.0%}"]
    modes = ", ".join(f"{mode.name} {mode.state_bytes_per_param:.2f}" for mode in standard_modes())
    lines.append(f"precision: {plan.precision['actor'].name}; state bytes per parameter (master + grad + optimizer): "
                 f"{modes}" + ("" if gpu.supports_fp8 else f"; fp8 compute: not on {gpu.name} (Hopper only)"))
    lines.append("as configured:")
    lines += memory_table(plan)
    verdict = "FITS" if plan.fits(job.headroom) else "DOES NOT FIT"
    lines.append(f"  -> {verdict} with {job.headroom:.0%} headroom")
    lines += [f"  problem: {problem}" for problem in plan.problems]
    lines.append(f"recommendation: {advice.reason}")
    for decision in advice.decisions.values():
        lines.append(f"  {decision.reason}")
    if advice.overrides:
        lines.append("  overrides: " + " ".join(advice.overrides))
    if advice.fits and advice.plan.setup != plan.setup:
        lines += memory_table(advice.plan)
    lines += why_lines(job.candidates)
    lines += time_lines(job)
    if job.comm is not None and job.shapes is not None and job.timed_config is not None:
        lines += comm_section(job.timed_config, job.shapes, job.comm, job.timed_setup, gpu.memory_bytes,
                              job.headroom, job.network_assumed)
    return "\n".join(lines)


def time_lines(job: JobPlan) -> list[str]:
    step = job.step_time
    phases = ", ".join(f"{name} {seconds:.2f} s" if math.isfinite(seconds) else f"{name} impossible"
                       for name, seconds in step.phases.items())
    lines = [f"time (roofline at {step.efficiency:.0%} of peak {job.gpu.bf16_flops / 1e12:.0f} TFLOP/s bf16, "
             f"{job.gpu.bandwidth / 1e9:.0f} GB/s): {phases}; step "
             + (f"{step.total:.2f} s" if math.isfinite(step.total) else "cannot run")]
    if not math.isfinite(step.total):
        lines.append("  the rollout engine's KV cache holds no whole sequence (prompt + response) at this layout: it "
                     "cannot generate; raise rollout.gpu_memory_utilization or rollout.tensor_model_parallel_size")
        return lines
    if job.hours is None:
        lines.append("  total: set trainer.total_training_steps (or --steps) for the run's hours and cost")
        return lines
    total = f"  {job.total_steps} steps -> {job.hours:.2f} h"
    if job.cost is not None:
        total += (f"; cost at ${job.price_per_gpu_hour:.2f}/GPU-hour x {job.num_devices} GPUs: ${job.cost:,.2f} "
                  f"(= price x hours at peak / efficiency {step.efficiency:g})")
    lines.append(total)
    return lines


def why_lines(candidates: list[Candidate]) -> list[str]:
    """The chosen layout beside the runner-up: memory (GiB per device) and seconds, phase by phase."""
    if len(candidates) < 2:
        return []
    chosen, runner_up = candidates[0], candidates[1]
    lines = [f"why: {len(candidates)} layouts fit; the fastest beside the runner-up ({runner_up.layout}; "
             f"{', '.join(runner_up.savers) or 'no memory saver'}):",
             f"  {'phase':<16}{'GiB chosen':>12}{'runner-up':>12}{'s chosen':>12}{'runner-up':>12}"]
    phases = list(dict.fromkeys([*chosen.memory.phases, *chosen.phases, *runner_up.phases]))
    for phase in phases:
        memory = [candidate.memory.phases.get(phase) for candidate in (chosen, runner_up)]
        seconds = [candidate.phases.get(phase) for candidate in (chosen, runner_up)]
        cells = "".join(f"{'-' if value is None else f'{value / GIB:.2f}':>12}" for value in memory)
        cells += "".join(f"{'-' if value is None else f'{value:.2f}':>12}" for value in seconds)
        lines.append(f"  {phase:<16}{cells}")
    lines.append(f"  {'step':<16}{chosen.memory.peak_bytes / GIB:>12.2f}{runner_up.memory.peak_bytes / GIB:>12.2f}"
                 f"{chosen.seconds:>12.2f}{runner_up.seconds:>12.2f}")
    return lines
