"""The colocated hybrid-engine worker: actor (FSDP2 + optimizer), rollout and reference policy in one process per device.

The rollout generates with the actor's own module (``rollout.name=hf``), so generation always sees the latest update
and no weights move. Each method's dispatch is declared next to it; the controller calls
``group.call(ActorRolloutRefWorker.generate_sequences, prompts, params)`` and "go to definition" lands here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import torch

from hybridrl.autotune.adaptive_accumulation import AccumulationControl
from hybridrl.autotune.auto_micro_batch import resolve_plan
from hybridrl.autotune.grad_noise import NoiseScaleMonitor
from hybridrl.agents.lockstep import ReplicaGroup
from hybridrl.config.plugins import load_plugins
from hybridrl.config.pool_checks import reshard_method, resolved_weight_transport
from hybridrl.config.rollout_placement import replicas_apart
from hybridrl.config.schema import TrainConfig
from hybridrl.config.sizes import BatchPlan, gathers_once, role_plan
from hybridrl.engines.anti_forgetting import EWC_DIR, EWCRegularizer, PtxHook
from hybridrl.engines.base import TrainingEngine
from hybridrl.engines.checkpoint import export_hf, load_sharded, save_sharded
from hybridrl.engines.losses import PolicyLoss, SequenceForward, SFTLoss
from hybridrl.engines.offload import OptimizerOffload
from hybridrl.engines.optim import build_optimizer, build_scheduler
from hybridrl.engines.passes import log_probs
from hybridrl.hybrid_engine import WeightResharder, bucket_bytes_from_mb
from hybridrl.hybrid_engine.lora_weights import MergedLoraWeights
from hybridrl.hybrid_engine.channel import ChannelAddress
from hybridrl.hybrid_engine.publish import PublishedLayout, RankPublication, WeightPublisher
from hybridrl.modeling.fsdp import shard_model
from hybridrl.modeling.lora import adapted_layers, adapters_disabled, lora_enabled, merged_state_dict
from hybridrl.modeling.model_builder import build_model, load_tokenizer, torch_dtype
from hybridrl.modeling.multimodal import freeze_vision_tower
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout import EngineInputs, RolloutEngine, build_rollout_engine, holds_own_weights
from hybridrl.rollout.base import SamplingParams
from hybridrl.runtime import Worker, dp_leaders, dp_split, one_to_all, rank_zero, reuse
from hybridrl.utils.collectives import CollectiveTimer
from hybridrl.utils.distributed import full_tensor
from hybridrl.utils.seeding import derive_seed
from hybridrl.workers.agent_rollout import engine_context_length, episode_runner
from hybridrl.workers.building import (data_parallel_group, frozen_engine, log_prob_micro_batching, sharding_options,
                                       split_sequences, training_micro_batching)
from hybridrl.workers.engine_weights import EngineWeights
from hybridrl.workers.routing import AGREEMENT_META, ActorRouting
from hybridrl.workers.step_metrics import update_resource_metrics

logger = logging.getLogger(__name__)


NO_WEIGHT_SYNC = {"weight_sync/seconds": 0.0, "weight_sync/bytes": 0.0,  # what a rollout on the actor's module syncs
                  "weight_sync/delivered_bytes": 0.0}


class ActorRolloutRefWorker(Worker):
    """One rank of the hybrid engine.

    Args:
        config: the validated trainer config.
        total_training_steps: training steps of the run (sizes the learning-rate schedule).
        with_reference: build a frozen reference policy (needed for a KL loss or KL in the reward). With LoRA
            (``model.lora.rank > 0``) no second model is built: the reference is the actor with adapters disabled.
    """

    @classmethod
    def process_profile(cls, config: TrainConfig, *args, **kwargs) -> str:
        """``vllm`` when the rollout engine is vLLM in this worker's own process (a parked process is chosen by it)."""
        return reuse.VLLM if config.rollout.name == "vllm" and not replicas_apart(config) else reuse.PLAIN

    def __init__(self, config: TrainConfig, total_training_steps: int, with_reference: bool) -> None:
        load_plugins(config.trainer.plugins)  # the components a recipe registered, in this process too
        torch.manual_seed(config.trainer.seed)
        self.config = config
        self.plan = role_plan(config, "actor")
        sp_size = config.actor.ulysses_sequence_parallel_size
        dp = data_parallel_group(self, sp_size)
        self.all_ranks = data_parallel_group(self)  # FSDP2 shards over every rank, sequence-parallel or not
        device_type = self.device.type
        keep_gathered = gathers_once(config.actor.fsdp.gather_once, device_type, self.world_size)
        self.tokenizer = load_tokenizer(config.model)
        self.frozen_forward = SequenceForward(packed=config.model.use_remove_padding,
                                              share_prompts=config.model.share_prompts,
                                              fused_head=config.model.use_fused_kernels)
        """The reference's and the teacher's forwards: they route on their own."""
        actor_model = build_model(config.model, "actor", device_type=device_type).to(self.device)
        split_sequences(self, actor_model, sp_size)
        if config.actor.freeze_vision_tower:
            freeze_vision_tower(actor_model)
        self.routing = ActorRouting(actor_model, config.actor.router_replay.mode)
        self.forward = replace(self.frozen_forward, routes_by_record=self.routing.enabled)
        shard_model(actor_model, self.dp_mesh, sharding_options(config.model.dtype, config.actor.fsdp,
                                                                keep_gathered=keep_gathered))
        optimizer = build_optimizer(actor_model, config.actor.optim)
        optimizer_steps = total_training_steps * self.plan.num_mini_batches * config.actor.ppo_epochs
        scheduler = build_scheduler(optimizer, config.actor.optim, optimizer_steps)
        self.actor = TrainingEngine(actor_model, dp=dp, optimizer=optimizer, scheduler=scheduler,
                                    grad_clip=config.actor.grad_clip)
        # with param_offload FSDP2 keeps the state on the host already (and steps there)
        self.optimizer_offload = OptimizerOffload(
            optimizer, self.device, config.actor.fsdp.optimizer_offload and not config.actor.fsdp.param_offload)
        self.lora = lora_enabled(config.model.lora)
        self.with_reference = with_reference
        frozen = sharding_options(config.model.dtype, config.actor.fsdp, param_offload=config.ref.param_offload,
                                  keep_gathered=keep_gathered)
        self.reference = frozen_engine(self, config.model, config.model.path if with_reference and not self.lora
                                       else None, frozen, dp)
        self.teacher = frozen_engine(self, config.model, config.algorithm.distillation.teacher_path, frozen, dp)
        for frozen_model in (self.reference, self.teacher):
            split_sequences(self, frozen_model and frozen_model.model, sp_size)
        self.episodes = episode_runner(config, self.tokenizer)
        self.rollout = self._build_rollout(actor_model, self.all_ranks)
        # Sized last, so that on a GPU the budget sees what the reference and the rollout engine already hold.
        self.plan, self.micro_batch_sizing = resolve_plan(config, "actor", actor_model, self.plan, dp=dp,
                                                          device=self.device, optimizer=optimizer,
                                                          ranks=self.all_ranks)
        self.actor.micro_batching = training_micro_batching(config.actor, self.plan.micro_batch_size_per_gpu,
                                                            device_type, self.world_size)
        self.ewc: Optional[EWCRegularizer] = None
        self.accumulation = self._add_noise_scale_hooks(optimizer, scheduler)

    def _add_noise_scale_hooks(self, optimizer, scheduler) -> Optional[AccumulationControl]:
        """``actor.log_grad_noise_scale`` (the monitor) and ``actor.adaptive_accumulation`` (which feeds on it)."""
        actor = self.config.actor
        if not (actor.log_grad_noise_scale or actor.adaptive_accumulation.enable):
            return None
        monitor = NoiseScaleMonitor(self.actor.model, self.actor.dp)
        self.actor.hooks.append(monitor)
        if not actor.adaptive_accumulation.enable:
            return None
        control = AccumulationControl.from_config(
            actor.adaptive_accumulation, optimizer, scheduler, micro_batch_size=self.plan.micro_batch_size_per_gpu,
            reference_steps=self.plan.grad_accum_steps, world_size=self.actor.dp.size,
            local_step_sequences=self.plan.local_mini_batch_sequences * self.plan.num_mini_batches, monitor=monitor)
        control.attach(self.actor)
        return control

    def _build_rollout(self, actor_model, ranks) -> Optional[RolloutEngine]:
        """The generation engine: ``hf`` shares ``actor_model``; ``vllm`` holds its own copy, fed by a resharder.
        With replicas in processes of their own (a standalone pool, or ``rollout.engine_process=own``) there is
        none here: the weights are published for them instead (``publish_weights``)."""
        config = self.config
        self.publisher: Optional[WeightPublisher] = None
        if replicas_apart(config):
            self.publisher = WeightPublisher(actor_model, tp_size=config.rollout.tensor_model_parallel_size,
                                             dtype=torch_dtype(config.model.dtype), group=ranks.group,
                                             source=MergedLoraWeights(actor_model) if self.lora else None,
                                             transport=resolved_weight_transport(config),
                                             channel_timeout_s=config.rollout.weight_transfer_timeout_s,
                                             delta_full_every=config.rollout.weight_delta_full_every
                                             if config.rollout.weight_delta else 0)
            self.engine_weights = EngineWeights(None, verify=False, loaded_current=True)
            return None
        resharder = None
        if holds_own_weights(config.rollout.name):
            resharder = WeightResharder(actor_model, tp_size=config.rollout.tensor_model_parallel_size,
                                        group=ranks.group,
                                        bucket_bytes=bucket_bytes_from_mb(config.rollout.weight_sync_bucket_mb),
                                        dtype=torch_dtype(config.model.dtype),
                                        method=reshard_method(config),
                                        source=MergedLoraWeights(actor_model) if self.lora else None)
        self.engine_weights = EngineWeights(resharder, verify=config.rollout.verify_weight_sync,
                                            loaded_current=config.rollout.load_format != "dummy")
        return build_rollout_engine(config.rollout.name, EngineInputs(
            rollout=config.rollout, pad_token_id=self.tokenizer.pad_token_id,
            eos_token_ids=eos_token_ids(self.tokenizer, getattr(actor_model.generation_config, "eos_token_id", None)),
            model=actor_model, model_path=config.model.path,
            tokenizer_path=config.model.tokenizer_path,
            max_model_len=engine_context_length(config, self.episodes),
            dtype=config.model.dtype, seed=config.trainer.seed, record_routing=self.routing.enabled))

    @dp_leaders
    def generate_sequences(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Responses for this replica's prompts: the ``t_g`` ranks of a tensor-parallel replica get the same prompts
        and seed (their engines run in lockstep) and the replica's TP rank 0 returns them. The seed is combined with
        the replica index so replicas sample differently (with ``t_g = 1`` a replica is a rank)."""
        if params.seed is not None:
            params = params.with_seed(derive_seed(params.seed, "rank", self.context.dp_rank))
        self.engine_weights.require_current()
        self.optimizer_offload.offload()  # actor.fsdp.optimizer_offload: room for the rollout
        free_cache = self.config.rollout.free_cache_engine
        if free_cache:
            self.rollout.resume()
        output = self.episodes.run(self.rollout, prompts, params, replica=self._replica()) \
            if self.episodes is not None else \
            self.rollout.generate(prompts, params)
        if free_cache:
            self.rollout.release_memory()
        return output

    def _replica(self) -> Optional[ReplicaGroup]:
        """This rank's tensor-parallel replica (``None`` at ``t_g = 1``): episodes run on its leader only."""
        return ReplicaGroup.of(self.context.rollout_mesh, self.context.tp_size)

    @one_to_all(collect="first")
    def sync_rollout_weights(self, policy_version: Optional[int] = None) -> dict[str, float]:
        """Stream the updated actor weights into a separate engine (vLLM), as the weights of the trainer's
        ``policy_version`` (``None``: one more than the engine held); nothing to do for ``hf``.

        Returns the sync's seconds, the bytes rank 0 received from other ranks, and the bytes delivered to its engine
        (received + its own; with ``t_g > 1`` exactly its tensor-parallel slices). The collective runs on every rank.
        """
        resharder = self.engine_weights.resharder
        if resharder is None:
            return dict(NO_WEIGHT_SYNC)
        started = time.perf_counter()
        free_cache = self.config.rollout.free_cache_engine
        if free_cache:  # a sleeping engine (GPU) has dropped its weights' memory: wake it to load new ones
            self.rollout.resume()
        self.engine_weights.sync(self.rollout, policy_version)
        if free_cache:
            self.rollout.release_memory()
        stats = resharder.last_stats
        return {"weight_sync/seconds": time.perf_counter() - started, "weight_sync/bytes": float(stats.received_bytes),
                "weight_sync/delivered_bytes": float(stats.received_bytes + stats.local_bytes)}

    @one_to_all(collect="first")
    def published_layout(self) -> PublishedLayout:
        """Where the replicas in processes of their own find the published weights."""
        return self._publisher().layout

    @one_to_all(collect="first")
    def relabel_rollout_weights(self, policy_version: int) -> None:
        """The trainer moved on without changing the actor (``trainer.critic_warmup``): the colocated engine's
        weights are now those of ``policy_version``; refused if the actor did change since the last sync."""
        self.engine_weights.relabel(policy_version)

    @rank_zero
    def host_weight_channel(self, replica: int, readers: int) -> ChannelAddress:
        """``rollout.weight_transfer=collective``: host the rendezvous of replica ``replica``'s channel (its
        ``readers`` tensor-parallel ranks); every trainer rank then joins it (``join_weight_channel``)."""
        return self._publisher().host_channel(replica, readers)

    @one_to_all(collect="first")
    def join_weight_channel(self, replica: int, address: ChannelAddress) -> None:
        """Join replica ``replica``'s channel; returns once the replica's ranks have joined too."""
        self._publisher().join_channel(replica, address)

    @one_to_all
    def publish_weights(self, replicas: Optional[list[int]] = None, policy_version: int = 0) -> RankPublication:
        """Write this rank's rows of the current weights for the rollout pool; returns this rank's publication:
        (``rollout.verify_weight_sync``) its fingerprints ``[t_g, params]``, which the controller sums, and with the
        object-store transport the reference to its rows. ``replicas``: the live replicas' indices (the
        ``collective`` transport sends to those alone; ``None``: all), and ``policy_version`` heads what it sends (the
        loads check it)."""
        return self._publisher().publish(checked=self.config.rollout.verify_weight_sync, replicas=replicas,
                                         policy_version=policy_version)

    def _publisher(self) -> WeightPublisher:
        if self.publisher is None:
            raise RuntimeError("publish_weights needs rollout replicas in processes of their own (rollout.n_gpus > 0 "
                               "or rollout.engine_process=own)")
        return self.publisher

    def close(self) -> None:
        """Release the rollout engine (a tensor-parallel vLLM engine's process groups go before the worker's)."""
        close = getattr(getattr(self, "rollout", None), "close", None)
        if callable(close):
            close()
        for held in (getattr(getattr(self, "engine_weights", None), "resharder", None),
                     getattr(self, "publisher", None)):
            if held is not None:
                held.close()

    @dp_split
    def compute_log_prob(self, batch: Batch, temperature: float) -> Batch:
        """``old_log_probs`` (and ``entropy``) of the responses under the current policy, at the ``temperature`` the
        rollout sampled with."""
        micro_batching = log_prob_micro_batching(self.config, self.config.actor.log_prob_micro_batch_size_per_gpu,
                                                 self.plan.micro_batch_size_per_gpu, self.device.type,
                                                 self.world_size)
        result, agreement = self.routing.measured(batch, self.all_ranks, lambda: log_probs(
            self.actor, batch, micro_batching, self.forward, temperature=temperature))
        return result if agreement is None else result.with_meta(**{AGREEMENT_META: agreement})

    @dp_split
    def compute_teacher_log_prob(self, batch: Batch, temperature: float) -> Batch:
        """``teacher_log_probs`` of the responses under the distillation teacher, at the rollout's ``temperature``."""
        if self.teacher is None:
            raise RuntimeError("this worker has no teacher (algorithm.distillation.teacher_path is null)")
        result = log_probs(self.teacher, batch, self._frozen_micro_batching(), self.frozen_forward, temperature=temperature,
                           with_entropy=False)
        return Batch(tensors={Fields.TEACHER_LOG_PROBS: result[Fields.OLD_LOG_PROBS]})

    def _frozen_micro_batching(self):
        """Micro-batches of the reference's (and the teacher's) no-grad passes."""
        micro_batch_size = (self.config.ref.log_prob_micro_batch_size_per_gpu
                            or self.config.actor.log_prob_micro_batch_size_per_gpu)
        return log_prob_micro_batching(self.config, micro_batch_size, self.plan.micro_batch_size_per_gpu,
                                       self.device.type, self.world_size)

    @dp_split
    def compute_ref_log_prob(self, batch: Batch, temperature: float) -> Batch:
        """``ref_log_probs`` of the responses under the frozen reference policy (with LoRA: the actor's base model,
        adapters disabled), at the rollout's ``temperature``."""
        if not self.with_reference:
            raise RuntimeError("this worker was started without a reference policy (with_reference=False)")
        micro_batching = self._frozen_micro_batching()
        if self.lora:
            with adapters_disabled(self.actor.model):
                result = log_probs(self.actor, batch, micro_batching, self.frozen_forward, temperature=temperature,
                                   with_entropy=False)
        else:
            assert self.reference is not None
            result = log_probs(self.reference, batch, micro_batching, self.frozen_forward, temperature=temperature,
                               with_entropy=False)
        return Batch(tensors={Fields.REF_LOG_PROBS: result[Fields.OLD_LOG_PROBS]})

    @dp_split(pad=False)
    def update_actor(self, batch: Batch, *, step: int, temperature: float,
                     ptx: Optional[Batch] = None) -> dict[str, float]:
        """PPO epochs over this rank's share of training step ``step``'s data (0-based; it seeds the shuffle),
        sampled at ``temperature``; returns metrics averaged over optimizer steps.

        ``ptx``: the step's SFT rows (``actor.ptx``), this rank's share mixed into every optimizer step. With
        ``actor.ewc.coef > 0`` the first call anchors EWC at the current weights, its Fisher estimated on ``batch``.
        With adaptive accumulation the control's ``micro × K`` is the mini-batch.
        """
        actor = self.config.actor
        self.optimizer_offload.reload()
        if actor.ewc.coef > 0 and self.ewc is None:
            self._anchor_ewc(batch)
        mini_batch_size = (self.accumulation.local_mini_batch_size if self.accumulation is not None
                           else self.plan.local_mini_batch_sequences)
        hooks = []
        if ptx is not None and actor.ptx.coef > 0:
            hooks.append(PtxHook(ptx, len(batch) // mini_batch_size, SFTLoss(self.forward), actor.ptx.coef))
        loss = PolicyLoss.from_config(actor, self.config.data.max_response_length, forward=self.forward,
                                      temperature=temperature)
        with CollectiveTimer() as comm:
            metrics, agreement = self.routing.measured(batch, self.all_ranks, lambda: self.actor.train_epochs(
                batch, loss, mini_batch_size=mini_batch_size, epochs=actor.ppo_epochs, shuffle=actor.shuffle,
                seed=self.config.trainer.seed * 100_003 + step, group_prompts=self.forward.groups_prompts, hooks=hooks))
        if agreement is not None:  # over the update's forwards: the routers move after its first optimizer step
            metrics["routing_agreement_update"] = agreement
        self.engine_weights.actor_changed()
        return {**metrics, **update_resource_metrics(self.device, self.all_ranks, comm)}

    def _anchor_ewc(self, batch: Batch) -> None:
        """EWC anchored at the current weights, its Fisher from ``actor.ewc.fisher_batches`` parts of ``batch``."""
        ewc_config = self.config.actor.ewc
        parts = ewc_config.fisher_batches
        self.actor.model.train()
        ewc = EWCRegularizer(self.actor.model, ewc_config.coef, self.all_ranks)
        ewc.estimate_fisher(self.actor, batch.split([len(batch) // parts] * parts), SFTLoss(self.forward))
        self._use_ewc(ewc)

    def _use_ewc(self, ewc: EWCRegularizer) -> None:
        self.actor.hooks = [hook for hook in self.actor.hooks if not isinstance(hook, EWCRegularizer)] + [ewc]
        self.ewc = ewc

    @dp_split(pad=False)
    def update_sft(self, batch: Batch) -> dict[str, float]:
        """One supervised optimizer step on this rank's share of ``batch`` (prompt + target rows, rollout layout)."""
        self.actor.model.train()
        metrics = self.actor.optimizer_step(batch, SFTLoss(self.forward), hooks=())
        self.engine_weights.actor_changed()
        return metrics

    @one_to_all(collect="first")
    def batch_plan(self) -> tuple[BatchPlan, str]:
        """The actor's batch plan as the worker runs it (an ``auto`` micro-batch resolved) and the sizing decision's
        log line (empty unless ``auto``)."""
        return self.plan, self.micro_batch_sizing.line() if self.micro_batch_sizing else ""

    @one_to_all(collect="first")
    def save_checkpoint(self, directory: str) -> str:
        """Actor model, optimizer, scheduler and RNG states under ``directory`` (every rank writes its shards); with
        LoRA only the adapters and their optimizer state (the frozen base is ``model.path``); EWC's anchor and Fisher
        once estimated (``ewc/``)."""
        self.optimizer_offload.reload()  # an offloaded optimizer is saved from where the update will use it
        save_sharded(directory, self.actor.model, self.actor.optimizer, self.actor.scheduler,
                     trainable_only=self.lora)
        if self.ewc is not None:
            self.ewc.save(Path(directory) / EWC_DIR)
        return directory

    @one_to_all(collect="first")
    def load_checkpoint(self, directory: str) -> str:
        """Restore what ``save_checkpoint`` wrote (the DP size may differ)."""
        self.optimizer_offload.reload()
        load_sharded(directory, self.actor.model, self.actor.optimizer, self.actor.scheduler,
                     trainable_only=self.lora)
        self.engine_weights.actor_changed()
        if self.config.actor.ewc.coef > 0 and (Path(directory) / EWC_DIR).is_dir():  # else: anchored at next update
            self._use_ewc(EWCRegularizer.load(Path(directory) / EWC_DIR, self.actor.model,
                                              self.config.actor.ewc.coef, self.all_ranks))
        return directory

    @one_to_all(collect="first")
    def export_hf(self, directory: str) -> str:
        """The current policy as a Hugging Face directory (safetensors + tokenizer) that transformers and vLLM load;
        with LoRA, the adapters merged into the base weights."""
        model = self.actor.model
        if not self.lora:
            return str(export_hf(model, self.tokenizer, directory))
        layers = adapted_layers(model)
        return str(export_hf(model, self.tokenizer, directory, merge=lambda state: merged_state_dict(state, layers),
                             writer=model.get_base_model()))

    @one_to_all(collect="first")
    def parameter_checksum(self) -> float:
        """Sum of all actor parameters (gathered): a cheap fingerprint for determinism and resume tests."""
        total = torch.zeros((), dtype=torch.float64)
        for param in self.actor.model.parameters():
            total += full_tensor(param).detach().double().sum()
        return float(total)


def eos_token_ids(tokenizer, generation_eos: object = None) -> list[int]:
    """EOS ids that end a response: the tokenizer's EOS plus the model's ``generation_config.eos_token_id`` (an int or
    a list; chat models often stop on an end-of-turn token that is not the tokenizer's EOS)."""
    ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    extra = generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
    ids += [int(token) for token in extra if token is not None and int(token) not in ids]
    if not ids:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no eos_token; generation could never stop")
    return ids
