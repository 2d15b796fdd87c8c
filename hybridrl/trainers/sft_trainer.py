"""Supervised fine-tuning on the same worker stack as RL — the warm-start checkpoint for an RL run.

The loss is the negative log-likelihood of the target response tokens (prompt tokens masked), normalised by the
global token count of the step, with the same exact gradient accumulation as the RL losses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path


from hybridrl.config.loader import dump_config
from hybridrl.config.monitoring import MonitoringConfig
from hybridrl.config.schema import ActorConfig, DataConfig, RolloutConfig, TrainConfig, TrainerConfig
from hybridrl.config.sft_schema import SFTConfig
from hybridrl.config.validation import resolved_device
from hybridrl.runtime import PoolSpec, WorkerGroup
from hybridrl.agents.conversation import encode_conversations
from hybridrl.agents.environment import resolve_tools
from hybridrl.data.sft import check_sft_lengths, check_sft_roles, encode_sft_examples
from hybridrl.data.sft_source import build_sft_source
from hybridrl.trainers.run_lock import run_directory_lock
from hybridrl.trainers.scaffold import cluster, open_tracker
from hybridrl.protocol import Batch
from hybridrl.workers.actor_worker import ActorRolloutRefWorker
from hybridrl.modeling.model_builder import load_tokenizer

logger = logging.getLogger(__name__)


@dataclass
class SFTResult:
    run_dir: Path
    export_dir: Path
    history: list[dict[str, float]] = field(default_factory=list)


def worker_config(config: SFTConfig) -> TrainConfig:
    """The policy worker's view of an SFT run: one mini-batch per step, no sampling, no critic."""
    data = config.data
    return TrainConfig(
        model=config.model,
        actor=ActorConfig(ppo_mini_batch_size=data.train_batch_size,
                          ppo_micro_batch_size_per_gpu=data.micro_batch_size_per_gpu, optim=config.optim,
                          fsdp=config.fsdp),
        rollout=RolloutConfig(n=1),
        data=DataConfig(train_batch_size=data.train_batch_size,
                        max_prompt_length=data.max_prompt_length, max_response_length=data.max_response_length),
        trainer=TrainerConfig(device=config.trainer.device, nnodes=config.trainer.nnodes,
                              n_gpus_per_node=config.trainer.n_gpus_per_node, seed=config.trainer.seed,
                              ray=config.trainer.ray),
    )


class SFTTrainer:
    """Fine-tunes ``model.path`` on supervised pairs and exports the result as a Hugging Face directory."""

    def __init__(self, config: SFTConfig) -> None:
        self.config = config
        self.run_dir = Path(config.trainer.default_local_dir)
        self.export_dir = Path(config.trainer.export_dir) if config.trainer.export_dir else self.run_dir / "hf"
        self.tokenizer = load_tokenizer(config.model)
        data = config.data
        self.source = build_sft_source(data.train_files if data.synthetic_task is None else [], data.synthetic_task,
                                       data.synthetic_task_kwargs, seed=data.seed)
        # every file row is checked now, naming its file and row, not when its step comes
        check_sft_roles(self.tokenizer, self.source.examples, data.apply_chat_template)
        check_sft_lengths(self.tokenizer, [e for e in self.source.examples if not e.turns], data.max_response_length,
                          data.apply_chat_template, data.max_prompt_length)
        self.tool_schemas = [tool.schema() for tool in resolve_tools(data.tools)]

    def batch(self, step: int) -> Batch:
        """The ``step``-th batch of ``train_batch_size`` examples (cycling over the examples); multi-turn
        demonstrations (``SFTExample.turns``) are encoded as the agent loop encodes episodes."""
        data = self.config.data
        picked = self.source.take(step, data.train_batch_size)
        if any(example.turns for example in picked):
            return encode_conversations(self.tokenizer, picked, data.max_response_length, self.tool_schemas,
                                        max_prompt_length=data.max_prompt_length)
        return encode_sft_examples(self.tokenizer, picked, data.max_response_length, data.apply_chat_template,
                                   max_prompt_length=data.max_prompt_length)

    def fit(self) -> SFTResult:
        config, trainer = self.config, self.config.trainer
        result = SFTResult(self.run_dir, self.export_dir)
        pool = PoolSpec("sft", nnodes=trainer.nnodes, devices_per_node=trainer.n_gpus_per_node,
                        device=resolved_device(worker_config(config)))
        with run_directory_lock(self.run_dir), cluster(trainer.ray, [pool], {"actor": "sft"}) as pools, \
                WorkerGroup(ActorRolloutRefWorker, pools.pool_for("actor"), name="sft_actor",
                            args=(worker_config(config), trainer.total_training_steps, False)) as group:
            dump_config(config, self.run_dir)
            tracker = open_tracker(trainer, self.run_dir, total_steps=trainer.total_training_steps,
                                   monitoring=MonitoringConfig())
            try:
                for step in range(trainer.total_training_steps):
                    metrics = group.call(ActorRolloutRefWorker.update_sft, self.batch(step))[0]
                    metrics = {f"sft/{name}": value for name, value in metrics.items()}
                    tracker.log(metrics, step=step + 1)
                    result.history.append(metrics)
                group.call(ActorRolloutRefWorker.export_hf, str(self.export_dir))
            finally:
                tracker.close()
        return result
