"""``*.ppo_micro_batch_size_per_gpu: auto``: the micro-batch sized from memory when a training worker starts.

The rule is :func:`~hybridrl.autotune.memory_sizing.choose_micro_batch_size`: the largest power-of-two micro-batch
dividing the per-rank mini-batch whose forward/backward at the **longest expected sequence** (``max_prompt_length +
max_response_length``, every row full, every token scored) stays under ``budget × (1 − headroom)``; the accumulation
steps follow from ``global = micro × accumulation × world``. What "needs" means depends on the device:

- **CUDA, actor**: a real probe (:func:`~hybridrl.autotune.memory_probe.probe_peak_bytes`, two micro-batches as in
  training — synced as ``actor.fsdp.grad_sync`` says — the maximum over ranks) of the whole process's allocated peak, plus AdamW's moments while the optimizer
  has not yet stepped (they are allocated lazily). The budget defaults to what the process can allocate now (free +
  its own reserved memory, the least over ranks). A candidate whose analytic estimate already exceeds the budget is
  not probed: an out-of-memory error on one rank in the middle of a sharded forward would strand the others.
- **CPU, or the critic** (a value head, which the log-prob probe cannot drive): the analytic model of this role's
  model states and activations (:func:`~hybridrl.autotune.memory_sizing.estimate_micro_batch_bytes`) against the
  configured budget. For a critic it counts an LM head's logits, so it errs on the safe side.

Every rank reaches the same decision (same budget, same measurements), so micro-batch counts match across ranks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import BatchPlan, gathers_once, shard_group_ranks
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.autotune.memory_probe import MeasureFn, max_over_ranks, make_probe
from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.model_builder import torch_dtype
from hybridrl.autotune.memory_sizing import (
    FP32,
    DecoderShape,
    MicroBatchDecision,
    Precision,
    choose_micro_batch_size,
    estimate_micro_batch_bytes,
    format_bytes,
    model_state_bytes,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoMicroBatch:
    """An ``auto`` micro-batch decision with what it was based on (bytes per rank).

    ``state_bytes`` and ``per_sequence_bytes``: the analytic model states and the activation peak of one sequence at
    ``seq_len`` — the slope of the decision, logged even when the candidates were measured.
    """

    role: str
    decision: MicroBatchDecision
    budget_bytes: float
    budget_source: str
    method: str
    seq_len: int
    state_bytes: float
    per_sequence_bytes: float

    def line(self) -> str:
        """The one log line: budget, per-sequence estimate, chosen micro-batch, accumulation steps."""
        return (f"{self.role}.ppo_micro_batch_size_per_gpu=auto: budget {format_bytes(self.budget_bytes)} "
                f"({self.budget_source}); estimate {format_bytes(self.state_bytes)} model states + "
                f"{format_bytes(self.per_sequence_bytes)} per sequence of {self.seq_len} tokens (analytic); "
                f"{self.method}: {self.decision.reason}")


def sizing_options(config: TrainConfig, role: str, world_size: int, device_type: str = "cuda") -> dict:
    """Keyword options of the analytic model for ``role`` under ``config`` on ``device_type`` workers (dtypes,
    checkpointing, packing, whether FSDP2 holds unsharded gradients between micro-batches — ``fsdp.grad_sync=step``
    — and the whole model's gathered parameters — ``fsdp.gather_once``; the ranks that split each sequence).
    ``world_size``: the role's ranks (FSDP2 shards over all of them)."""
    model, fsdp = config.model, getattr(config, role).fsdp
    precision = Precision(compute_bytes=torch_dtype(model.dtype).itemsize,
                          grad_bytes=torch_dtype(fsdp.reduce_dtype).itemsize)
    # FSDP2's root returns fp32 outputs (hybridrl.modeling.fsdp), so the loss sees fp32 logits.
    return dict(world_size=shard_group_ranks(fsdp.fsdp_size, world_size), precision=precision,
                checkpointing=model.enable_gradient_checkpointing, packed=model.use_remove_padding,
                sequence_parallel=getattr(config, role).ulysses_sequence_parallel_size,
                attention=attention_implementation(model.attn_implementation, device_type, torch_dtype(model.dtype)),
                accumulating=fsdp.grad_sync == "step", logits_bytes=FP32,
                gather_once=gathers_once(fsdp.gather_once, device_type, world_size))


def memory_budget(budget_mb: Optional[int], device: torch.device, dp: DataParallelGroup) -> tuple[float, str]:
    """``(bytes, where they come from)``: the configured MiB, else on CUDA the least over ranks of free + reserved."""
    if budget_mb is not None:
        return float(budget_mb) * 2**20, "configured"
    if device.type != "cuda":
        raise ValueError("micro_batch_sizing.memory_budget_mb is required on CPU (no allocator statistics)")
    free, _ = torch.cuda.mem_get_info(device)
    available = float(free + torch.cuda.memory_reserved(device))
    if dp.size > 1:
        available = -max_over_ranks(-available, dp, device)
    return available, "CUDA free + reserved at start-up, least over ranks"


def cuda_measure_fn(model: nn.Module, shape: DecoderShape, options: dict, *, budget_bytes: float,
                    dp: DataParallelGroup, optimizer: Optional[torch.optim.Optimizer],
                    grad_sync: str = "step") -> MeasureFn:
    """Probe the process's peak on the device (two micro-batches synced as ``grad_sync`` says), screened by the
    analytic model (see the module docstring)."""
    probe = make_probe(model, packed=options["packed"], accumulating=True, grad_sync=grad_sync,
                       gather_once=options["gather_once"], optimizer=optimizer, dp=dp)
    lazy_moments = 0 if optimizer is not None and optimizer.state else model_state_bytes(
        shape, world_size=options["world_size"], precision=options["precision"]).optimizer

    def measure(micro_batch_size: int, seq_len: int) -> float:
        predicted = estimate_micro_batch_bytes(shape, micro_batch_size, seq_len, **options).total
        if predicted > budget_bytes:
            return float(predicted)
        return probe(micro_batch_size, seq_len) + lazy_moments

    return measure


def size_micro_batch(config: TrainConfig, role: str, model: nn.Module, plan: BatchPlan, *,
                     dp: DataParallelGroup, device: torch.device, optimizer: Optional[torch.optim.Optimizer] = None,
                     ranks: Optional[DataParallelGroup] = None) -> AutoMicroBatch:
    """Choose ``role``'s micro-batch for ``plan`` (an ``auto`` plan) on this rank; every rank must call it.

    Raises:
        ValueError: even one sequence does not fit the budget (the message says what to change).
    """
    sizing = getattr(config, role).micro_batch_sizing
    seq_len = config.data.max_prompt_length + config.data.max_response_length
    shape = DecoderShape.from_hf_config(model.config)
    ranks = ranks or dp
    options = sizing_options(config, role, ranks.size, device.type)  # FSDP2 shards over every rank
    budget, source = memory_budget(sizing.memory_budget_mb, device, ranks)
    if device.type == "cuda" and role == "actor":
        method = "measured on the device"
        measure = cuda_measure_fn(model, shape, options, budget_bytes=budget, dp=ranks, optimizer=optimizer,
                                  grad_sync=getattr(config, role).fsdp.grad_sync)
    else:
        method = "analytic model"

        def measure(micro_batch_size: int, length: int) -> float:
            return float(estimate_micro_batch_bytes(shape, micro_batch_size, length, **options).total)

    decision = choose_micro_batch_size(budget, seq_len=seq_len, local_mini_batch_size=plan.local_mini_batch_sequences,
                                       measure_fn=measure, headroom=sizing.headroom, world_size=dp.size, log=False)
    one = estimate_micro_batch_bytes(shape, 1, seq_len, **options)
    result = AutoMicroBatch(role=role, decision=decision, budget_bytes=budget, budget_source=source, method=method,
                            seq_len=seq_len, state_bytes=float(one.states.total),
                            per_sequence_bytes=float(one.activations.peak))
    logger.info("%s", result.line())
    return result


def resolve_plan(config: TrainConfig, role: str, model: nn.Module, plan: BatchPlan, *, dp: DataParallelGroup,
                 device: torch.device, optimizer: Optional[torch.optim.Optimizer] = None,
                 ranks: Optional[DataParallelGroup] = None) -> tuple[BatchPlan, Optional[AutoMicroBatch]]:
    """``plan`` with an ``auto`` micro-batch sized (and the decision), or ``plan`` unchanged and ``None``.
    ``ranks``: every rank of the role (default ``dp``), over which the budget and the measured peak are agreed — the
    ranks of a sequence-parallel group must choose the same size."""
    if not plan.auto_micro_batch:
        return plan, None
    sized = size_micro_batch(config, role, model, plan, dp=dp, device=device, optimizer=optimizer, ranks=ranks)
    return plan.with_micro_batch_size(sized.decision.micro_batch_size), sized
