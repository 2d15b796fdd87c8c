"""AdamW with a warm-up + constant/cosine schedule, and a gradient step that refuses non-finite gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from hybridrl.config.schema import OptimConfig
from hybridrl.utils.distributed import full_tensor
from hybridrl.engines.precision import build_adamw, learning_rate


def build_optimizer(model: nn.Module, optim_config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters of ``model`` (FSDP2 DTensor shards included), its moments in fp32 or
    8-bit (``optim.state_precision``; see :mod:`hybridrl.engines.precision`)."""
    params = [param for param in model.parameters() if param.requires_grad]
    beta1, beta2 = optim_config.betas
    return build_adamw(params, lr=optim_config.lr, betas=(beta1, beta2), eps=optim_config.eps,
                       weight_decay=optim_config.weight_decay, state_precision=optim_config.state_precision,
                       device_type=params[0].device.type)


def warmup_steps(optim_config: OptimConfig, total_steps: int) -> int:
    """Warm-up length in optimizer steps: ``lr_warmup_steps`` if set, else ``ratio × total_steps``."""
    if optim_config.lr_warmup_steps > 0:
        return optim_config.lr_warmup_steps
    return int(optim_config.lr_warmup_steps_ratio * total_steps)


def lr_multiplier(step: int, *, warmup: int, total_steps: int, schedule: str, min_lr_ratio: float) -> float:
    """Learning-rate multiplier at optimizer step ``step`` (0-based): linear warm-up, then constant or cosine decay."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        decay_steps = max(1, total_steps - warmup)
        progress = min(1.0, (step - warmup) / decay_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler {schedule!r}; expected constant or cosine")


def build_scheduler(optimizer: torch.optim.Optimizer, optim_config: OptimConfig,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_multiplier` over ``total_steps`` optimizer steps."""
    warmup = warmup_steps(optim_config, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_multiplier(step, warmup=warmup, total_steps=total_steps, schedule=optim_config.lr_scheduler,
                                   min_lr_ratio=optim_config.min_lr_ratio),
    )


@dataclass
class StepResult:
    """Outcome of one optimizer step: the pre-clip global gradient norm, and whether the step was applied."""

    grad_norm: float
    applied: bool
    lr: float


def clipped_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler, max_norm: float) -> StepResult:
    """Clip the global gradient norm (across all FSDP shards) to ``max_norm`` and step — unless the norm is not finite,
    in which case the gradients are dropped and the weights stay unchanged (the caller counts skipped steps)."""
    params = [param for param in model.parameters() if param.grad is not None]
    grad_norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)))
    lr = learning_rate(optimizer)
    applied = math.isfinite(grad_norm)
    if applied:
        optimizer.step()
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(grad_norm=grad_norm, applied=applied, lr=lr)
