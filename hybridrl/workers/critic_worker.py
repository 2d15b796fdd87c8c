"""The critic worker: a value model (FSDP2) that computes values and learns from returns.

It runs as its own group: on the actor's bundles as separate processes (``bundle_share``) or in a pool of its own
(split placement).
"""

from __future__ import annotations

import torch

from hybridrl.autotune.auto_micro_batch import resolve_plan
from hybridrl.config.plugins import load_plugins
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import BatchPlan, gathers_once, role_plan
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.losses import SequenceForward, ValueLoss
from hybridrl.engines.offload import OptimizerOffload
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.engines.passes import values
from hybridrl.modeling.fsdp import shard_model
from hybridrl.modeling.model_builder import build_model
from hybridrl.protocol import Batch
from hybridrl.runtime import Worker, dp_split, one_to_all
from hybridrl.utils.collectives import CollectiveTimer
from hybridrl.workers.building import (data_parallel_group, sharding_options, split_sequences,
                                       training_micro_batching)
from hybridrl.workers.engine_checkpoints import EngineCheckpoints
from hybridrl.workers.step_metrics import update_resource_metrics


class CriticWorker(EngineCheckpoints, Worker):
    """One rank of the value model. ``total_training_steps`` sizes the learning-rate schedule."""

    def __init__(self, config: TrainConfig, total_training_steps: int) -> None:
        load_plugins(config.trainer.plugins)  # the components a recipe registered, in this process too
        torch.manual_seed(config.trainer.seed + 1)
        self.config = config
        critic = config.critic
        self.plan = role_plan(config, "critic")
        model = build_model(config.model, "critic", path=critic.model_path or config.model.path,
                            device_type=self.device.type).to(self.device)
        split_sequences(self, model, critic.ulysses_sequence_parallel_size)
        shard_model(model, self.dp_mesh, sharding_options(
            config.model.dtype, critic.fsdp,
            keep_gathered=gathers_once(critic.fsdp.gather_once, self.device.type, self.world_size)))
        optimizer = build_optimizer(model, critic.optim)
        scheduler = build_scheduler(optimizer, critic.optim,
                                    total_training_steps * self.plan.num_mini_batches * critic.ppo_epochs)
        dp = data_parallel_group(self, critic.ulysses_sequence_parallel_size)
        self.all_ranks = data_parallel_group(self)  # FSDP2 shards over every rank, sequence-parallel or not
        self.forward = SequenceForward(packed=config.model.use_remove_padding, share_prompts=config.model.share_prompts)
        self.engine = TrainingEngine(model, dp=dp, optimizer=optimizer, scheduler=scheduler, grad_clip=critic.grad_clip)
        # critic.fsdp.optimizer_offload: Adam's moments on the host outside the critic's own updates
        self.optimizer_offload = OptimizerOffload(optimizer, self.device,
                                                  critic.fsdp.optimizer_offload and not critic.fsdp.param_offload)
        self.plan, self.micro_batch_sizing = resolve_plan(config, "critic", model, self.plan, dp=dp,
                                                          device=self.device, optimizer=optimizer,
                                                          ranks=self.all_ranks)
        self.engine.micro_batching = training_micro_batching(critic, self.plan.micro_batch_size_per_gpu,
                                                             self.device.type, self.world_size)
        self.loss = ValueLoss.from_config(critic, config.data.max_response_length, forward=self.forward)

    @dp_split
    def compute_values(self, batch: Batch) -> Batch:
        """``values [B, R]`` of the state before each response token."""
        return values(self.engine, batch, self.engine.micro_batching, self.forward)

    @dp_split(pad=False)
    def update_critic(self, batch: Batch, *, step: int) -> dict[str, float]:
        """Value-loss epochs over this rank's share of training step ``step`` (0-based; it seeds the shuffle):
        ``values`` = old values, ``returns`` = targets."""
        with CollectiveTimer() as comm, self.optimizer_offload.resident():
            metrics = self.engine.train_epochs(batch, self.loss, mini_batch_size=self.plan.local_mini_batch_sequences,
                                               epochs=self.config.critic.ppo_epochs, shuffle=True,
                                               seed=self.config.trainer.seed * 100_019 + step,
                                               group_prompts=self.forward.groups_prompts)
        return {**metrics, **update_resource_metrics(self.device, self.all_ranks, comm)}

    @one_to_all(collect="first")
    def save_checkpoint(self, directory: str) -> str:
        """Model, optimizer (from the device, where an offloaded one is brought for it), scheduler and RNG states."""
        with self.optimizer_offload.resident():
            return super().save_checkpoint(directory)

    @one_to_all(collect="first")
    def load_checkpoint(self, directory: str) -> str:
        with self.optimizer_offload.resident():
            return super().load_checkpoint(directory)

    @one_to_all(collect="first")
    def batch_plan(self) -> tuple[BatchPlan, str]:
        """The critic's batch plan as run (an ``auto`` micro-batch resolved) and the sizing line (empty unless auto)."""
        return self.plan, self.micro_batch_sizing.line() if self.micro_batch_sizing else ""
