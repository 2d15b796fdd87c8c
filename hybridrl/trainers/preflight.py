"""Everything a trainer checks before Ray starts, as one call, so ``hybridrl config`` refuses exactly what
``hybridrl train`` (``sft``, ``rm``) would refuse before its first worker: the trainer's own constructor does the
checking (tokenizer, every data row and its length, reward routing of every ``data_source``, the custom reward file,
PPO-ptx and replay data), and this module builds it without starting anything."""

from __future__ import annotations

from typing import Any


def trainer_class(config: Any) -> type:
    """The trainer that runs ``config``: ``RLTrainer``, ``SFTTrainer``, ``RMTrainer`` or ``DPOTrainer``, by its
    schema."""
    from hybridrl.config.dpo_schema import DPOConfig
    from hybridrl.config.rm_schema import RMConfig
    from hybridrl.config.sft_schema import SFTConfig
    from hybridrl.trainers.dpo_trainer import DPOTrainer
    from hybridrl.trainers.rl_trainer import RLTrainer
    from hybridrl.trainers.rm_trainer import RMTrainer
    from hybridrl.trainers.sft_trainer import SFTTrainer

    return {SFTConfig: SFTTrainer, RMConfig: RMTrainer, DPOConfig: DPOTrainer}.get(type(config), RLTrainer)


def check_run_inputs(config: Any) -> None:
    """Raise what the trainer's start-up would raise for ``config`` (a loaded, validated config); return ``None``
    when the run would reach its workers. Reads the data and the tokenizer; starts no process."""
    trainer_class(config)(config)
