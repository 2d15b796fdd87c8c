"""The reward-model trainer's configuration (``conf/rm_trainer.yaml``): Bradley–Terry training on preference pairs,
on the same FSDP2 worker stack and gradient-accumulation loop as the actor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.job_schema import JobTrainerConfig
from hybridrl.config.schema import FSDPConfig, ModelConfig, OptimConfig


SYNTHETIC_PREFERENCES = ("correct", "shorter")
"""``data.synthetic_preference`` choices (built by :mod:`hybridrl.data.synthetic_preference`)."""


@dataclass
class RMDataConfig(FreezableConfig):
    train_files: list[str] = field(default_factory=list)
    """Parquet/JSONL preference rows: ``prompt`` with ``chosen``/``rejected`` (optional ``margin``), or ``prompt`` with
    ``responses`` ranked best first (every ordered pair is used)."""
    val_files: list[str] = field(default_factory=list)
    """Held-out preference rows; empty = hold out ``val_fraction`` of the training prompts."""
    val_fraction: float = 0.05
    """Share of training prompts held out for validation when ``val_files`` is empty (by a fixed hash of the prompt)."""
    synthetic_task: Optional[str] = None
    """Build pairs from a synthetic task instead of files, e.g. ``arithmetic`` (see ``synthetic_preference``)."""
    synthetic_task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the synthetic task (e.g. ``max_first_operand``, ``num_val``)."""
    synthetic_preference: str = "correct"
    """How synthetic pairs are made: ``correct`` (right answer over a near-miss) | ``shorter`` (shorter response)."""
    synthetic_spread: int = 9
    """Synthetic pairs: largest distance of a wrong answer (``correct``) or most extra characters (``shorter``)."""
    max_prompt_length: int = 512
    """Prompt tokens after the chat template (longer prompts are an error naming the row)."""
    max_response_length: int = 512
    """Tokens of each response including EOS (longer responses are an error naming the row)."""
    train_batch_size: int = 64
    """Pairs per optimizer step (global). Must equal micro × accumulation × devices."""
    micro_batch_size_per_gpu: int = 8
    """Pairs per forward/backward on one device (2× sequences: chosen and rejected go through together)."""
    val_batch_size: int = 256
    """Held-out pairs scored per validation (the first ones, in a fixed order)."""
    shuffle: bool = True
    """Reshuffle the training pairs every epoch (seeded by ``seed`` and the epoch)."""
    seed: int = 1
    """Seed of the data order and of synthetic pairs."""
    apply_chat_template: bool = True
    """Format prompts with the tokenizer's chat template (as the RL rollout will)."""


@dataclass
class RMLossConfig(FreezableConfig):
    margin: float = 0.0
    """Constant margin added to each pair's own ``margin`` column: loss = −log σ(r_c − r_r − margin)."""
    center_coef: float = 0.0
    """Centring regulariser λ·(r_c + r_r)² per pair (keeps rewards near zero mean); 0 disables it."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; a non-finite norm skips the step."""
    log_grad_noise_scale: bool = True
    """Log the gradient-noise scale ``rm/grad_noise/*`` (needs >= 2 micro-batches or ranks per step)."""


@dataclass
class RMTrainerConfig(JobTrainerConfig):
    experiment_name: str = "rm"
    """Experiment name (tracking, run directory)."""
    test_freq: int = 10
    """Validate every this many steps (-1: only before and after training)."""
    val_before_train: bool = True
    """Measure held-out accuracy before the first step (the baseline of the gain)."""
    save_freq: int = -1
    """Checkpoint every this many steps (-1: never; the HF export at the end always happens)."""
    resume_mode: str = "auto"
    """``auto`` (continue from the run directory's latest checkpoint) | ``disable``."""
    max_ckpt_to_keep: Optional[int] = None
    """Keep only the newest this many checkpoints (``null``: all)."""


@dataclass
class RMConfig(FreezableConfig):
    """The reward-model trainer's whole configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The backbone (a causal LM directory, or a reward model to continue training); a scalar head is added."""
    data: RMDataConfig = field(default_factory=RMDataConfig)
    """Preference pairs."""
    loss: RMLossConfig = field(default_factory=RMLossConfig)
    """Bradley–Terry loss, clipping, gradient-noise logging."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5, weight_decay=0.0))
    """Optimizer and schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding settings (``optimizer_offload`` does not apply: the optimizer steps every step;
    ``param_offload`` keeps parameters, gradients and the optimizer step on the host)."""
    trainer: RMTrainerConfig = field(default_factory=RMTrainerConfig)
    """Devices, steps, validation, checkpoints, logging."""
