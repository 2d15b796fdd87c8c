"""The preference-optimisation worker (``hybridrl dpo``): one rank of an FSDP2-sharded causal LM trained on preference
pairs, beside its frozen reference policy (none for reference-free losses; with LoRA, the same model with its
adapters off).

The controller (``hybridrl.trainers.dpo_trainer``) calls ``reference_log_probs`` on pairs (all of them once, or each
step's), ``update`` once per optimizer step, ``policy_log_probs`` for validation, ``release_reference`` once the
reference has scored everything it will, and the checkpoint/export methods.
"""

from __future__ import annotations

import torch

from hybridrl.config.dpo_schema import REFERENCE_FREE_LOSSES, DPOConfig
from hybridrl.data.preference import PairFields
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.checkpoint import export_hf
from hybridrl.engines.micro_batches import MicroBatching
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.engines.passes import pair_log_probs_of
from hybridrl.engines.preference_losses import PreferenceOptimizationLoss
from hybridrl.modeling.fsdp import shard_model
from hybridrl.modeling.lora import adapters_disabled, lora_enabled
from hybridrl.modeling.model_builder import build_model, load_tokenizer
from hybridrl.protocol import Batch
from hybridrl.runtime import Worker, dp_split, one_to_all
from hybridrl.workers.building import data_parallel_group, frozen_engine, sharding_options
from hybridrl.workers.engine_checkpoints import EngineCheckpoints


class DPOTrainWorker(EngineCheckpoints, Worker):
    """One rank of preference optimisation. ``total_training_steps`` (``trainer.*``) sizes the learning-rate
    schedule."""

    def __init__(self, config: DPOConfig) -> None:
        torch.manual_seed(config.trainer.seed)
        self.config = config
        self.tokenizer = load_tokenizer(config.model)
        dp = data_parallel_group(self)
        device_type = self.device.type
        policy = build_model(config.model, "actor", device_type=device_type).to(self.device)
        shard_model(policy, self.dp_mesh, sharding_options(config.model.dtype, config.fsdp, keep_gathered=False))
        optimizer = build_optimizer(policy, config.optim)
        scheduler = build_scheduler(optimizer, config.optim, config.trainer.total_training_steps)
        self.micro_batching = MicroBatching(micro_batch_size=config.data.micro_batch_size_per_gpu,
                                            grad_sync=config.fsdp.grad_sync)
        self.engine = TrainingEngine(policy, dp=dp, optimizer=optimizer, scheduler=scheduler,
                                     grad_clip=config.loss.grad_clip, micro_batching=self.micro_batching)
        self.lora = lora_enabled(config.model.lora)
        builds_reference = config.loss.type not in REFERENCE_FREE_LOSSES and not self.lora
        self.reference = frozen_engine(self, config.model, config.model.path if builds_reference else None,
                                       sharding_options(config.model.dtype, config.fsdp, keep_gathered=False), dp)
        self.loss = PreferenceOptimizationLoss(config.data.max_response_length, config.loss,
                                               packed=config.model.use_remove_padding)

    @dp_split(pad=False)
    def update(self, pairs: Batch) -> dict[str, float]:
        """One optimizer step on this rank's share of the step's pairs (with their reference log-probs); metrics of
        the whole mini-batch."""
        self.engine.model.train()
        return self.engine.optimizer_step(pairs, self.loss)

    @dp_split
    def policy_log_probs(self, pairs: Batch) -> Batch:
        """``chosen_log_probs [B]``, ``rejected_log_probs [B]`` (summed, nats) under the policy (no gradients)."""
        return self._log_probs(self.engine, pairs, {"chosen": PairFields.CHOSEN_LOG_PROBS,
                                                    "rejected": PairFields.REJECTED_LOG_PROBS})

    @dp_split
    def policy_kl_log_probs(self, rows: Batch) -> Batch:
        """KTO: ``rejected_log_probs [B]`` of the rows' KL side alone under the policy (no gradients)."""
        return self._log_probs(self.engine, rows, {"rejected": PairFields.REJECTED_LOG_PROBS})

    @dp_split
    def reference_log_probs(self, pairs: Batch) -> Batch:
        """``reference_chosen_log_probs [B]``, ``reference_rejected_log_probs [B]`` under the frozen reference."""
        names = {"chosen": PairFields.REFERENCE_CHOSEN_LOG_PROBS, "rejected": PairFields.REFERENCE_REJECTED_LOG_PROBS}
        if self.lora:
            with adapters_disabled(self.engine.model):
                return self._log_probs(self.engine, pairs, names)
        if self.reference is None:
            raise RuntimeError(f"loss.type={self.config.loss.type} reads no reference policy, or it was released "
                               "(loss.reference_log_probs=precompute frees it once every pair is scored)")
        return self._log_probs(self.reference, pairs, names)

    @one_to_all(collect="first")
    def release_reference(self) -> bool:
        """Free the reference policy (every pair it will score is scored); whether there was one."""
        had = self.reference is not None
        self.reference = None
        if had and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return had

    def _log_probs(self, engine: TrainingEngine, pairs: Batch, names: dict[str, str]) -> Batch:
        data = self.config.data
        return pair_log_probs_of(engine, pairs, MicroBatching(micro_batch_size=data.micro_batch_size_per_gpu),
                                 data.max_response_length, names, packed=self.config.model.use_remove_padding)

    @one_to_all(collect="first")
    def export_hf(self, directory: str) -> str:
        """The trained policy as a Hugging Face directory (``model.path`` of an RL run, or ``hybridrl serve``)."""
        return str(export_hf(self.engine.model, self.tokenizer, directory))
