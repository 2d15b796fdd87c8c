"""The reward-model training worker: one rank of an FSDP2-sharded sequence classifier trained on preference pairs.

The controller (``hybridrl.trainers.rm_trainer``) calls ``update`` once per optimizer step with the step's pairs
(split over DP ranks), ``compute_rewards`` for validation, and the checkpoint/export methods — the actor's.
"""

from __future__ import annotations

import torch

from hybridrl.config.rm_schema import RMConfig
from hybridrl.config.sizes import gathers_once
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.checkpoint import export_hf
from hybridrl.engines.losses import BradleyTerryLoss
from hybridrl.engines.micro_batches import MicroBatching
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.engines.passes import pair_rewards_of
from hybridrl.autotune.grad_noise import NoiseScaleMonitor
from hybridrl.modeling.fsdp import shard_model
from hybridrl.modeling.model_builder import build_model, load_tokenizer
from hybridrl.protocol import Batch
from hybridrl.runtime import Worker, dp_split, one_to_all
from hybridrl.workers.building import data_parallel_group, sharding_options
from hybridrl.workers.engine_checkpoints import EngineCheckpoints


def build_reward_model(config: RMConfig, device: torch.device):
    """The trainable reward model: ``model.path`` as a one-label sequence classifier (a fresh score head over a causal
    LM), with the tokenizer's pad id in its config (the HF head needs one for batches of more than one row)."""
    tokenizer = load_tokenizer(config.model)
    model = build_model(config.model, "reward_model", device_type=device.type)
    model.config.pad_token_id = tokenizer.pad_token_id
    if config.model.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model.to(device), tokenizer


class RewardModelTrainWorker(EngineCheckpoints, Worker):
    """One rank of reward-model training. ``total_training_steps`` sizes the learning-rate schedule."""

    def __init__(self, config: RMConfig) -> None:
        torch.manual_seed(config.trainer.seed)
        self.config = config
        model, self.tokenizer = build_reward_model(config, self.device)
        gather_once = gathers_once(config.fsdp.gather_once, self.device.type, self.world_size)
        shard_model(model, self.dp_mesh, sharding_options(config.model.dtype, config.fsdp, keep_gathered=gather_once))
        optimizer = build_optimizer(model, config.optim)
        scheduler = build_scheduler(optimizer, config.optim, config.trainer.total_training_steps)
        dp = data_parallel_group(self)
        micro_batch_size = config.data.micro_batch_size_per_gpu
        self.engine = TrainingEngine(model, dp=dp, optimizer=optimizer, scheduler=scheduler,
                                     grad_clip=config.loss.grad_clip,
                                     micro_batching=MicroBatching(
                                         micro_batch_size=micro_batch_size, grad_sync=config.fsdp.grad_sync,
                                         gather_once=gather_once, defer_all_reduce=config.fsdp.defer_all_reduce),
                                     hooks=[NoiseScaleMonitor(model, dp)] if config.loss.log_grad_noise_scale else [])
        self.loss = BradleyTerryLoss(packed=config.model.use_remove_padding, loss=config.loss)

    @dp_split(pad=False)
    def update(self, pairs: Batch) -> dict[str, float]:
        """One optimizer step on this rank's share of the step's pairs; metrics of the whole mini-batch."""
        self.engine.model.train()
        return self.engine.optimizer_step(pairs, self.loss)

    @dp_split
    def compute_rewards(self, pairs: Batch) -> Batch:
        """``chosen_rewards [B]``, ``rejected_rewards [B]`` of the pairs (no gradients)."""
        micro_batching = MicroBatching(micro_batch_size=self.config.data.micro_batch_size_per_gpu)
        return pair_rewards_of(self.engine, pairs, micro_batching, packed=self.config.model.use_remove_padding)

    @one_to_all(collect="first")
    def export_hf(self, directory: str) -> str:
        """The reward model as a Hugging Face directory that ``reward_model.model_path`` of an RL run loads."""
        return str(export_hf(self.engine.model, self.tokenizer, directory))
