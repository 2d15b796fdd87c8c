"""The SFT trainer's configuration (``conf/sft_trainer.yaml``): supervised warm-start on the same FSDP2 worker stack."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.job_schema import JobTrainerConfig
from hybridrl.config.schema import FSDPConfig, ModelConfig, OptimConfig


@dataclass
class SFTDataConfig(FreezableConfig):
    train_files: list[str] = field(default_factory=list)
    """Parquet/JSONL rows in the RL schema; the target response is ``reward_model.ground_truth``."""
    synthetic_task: Optional[str] = None
    """Generate (prompt, answer) pairs on the fly instead, e.g. ``arithmetic``."""
    synthetic_task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Options of the synthetic task (e.g. ``max_digits``, ``operators``)."""
    max_prompt_length: int = 512
    """Prompt tokens after the chat template (longer prompts are an error)."""
    max_response_length: int = 512
    """Target tokens including EOS (longer targets are an error)."""
    train_batch_size: int = 64
    """Sequences per optimizer step (global)."""
    micro_batch_size_per_gpu: int = 16
    """Sequences per forward/backward on one device."""
    seed: int = 1
    """Seed of the data stream."""
    apply_chat_template: bool = True
    """Format prompts with the tokenizer's chat template (as the RL rollout will)."""
    tools: list[str] = field(default_factory=list)
    """Tools whose schemas the chat template renders into multi-turn demonstrations' prompts (the same list as the
    RL run's ``rollout.multi_turn.tools``, so SFT and RL prompts are the same ids)."""


@dataclass
class SFTTrainerConfig(JobTrainerConfig):
    experiment_name: str = "sft"
    """Experiment name (tracking, run directory)."""


@dataclass
class SFTConfig(FreezableConfig):
    """The SFT trainer's whole configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model to fine-tune."""
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Supervised pairs."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, weight_decay=0.0))
    """Optimizer and schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings of the fine-tuned model (e.g. ``fsdp.grad_sync=micro_batch`` to hold only sharded gradients
    while accumulating)."""
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    """Devices, steps, logging."""
