"""The policy's training engine on one rank: log-probs and PPO-style updates of an (FSDP2-sharded) causal LM.

No Ray here: the Ray worker (``hybridrl.workers.actor_worker``) owns one of these per process, and the tests drive it
directly in gloo process groups to check exact equivalence with a single-process reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from hybridrl.algorithms import POLICY_LOSSES, aggregate_loss, kl_penalty, masked_mean
from hybridrl.config.schema import ActorConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.engines.accumulation import (
    DataParallelGroup,
    MicroBatching,
    forward_micro_batches,
    train_epochs,
    train_mini_batch,
)
from hybridrl.engines.anti_forgetting import EWCRegularizer, PtxMixer, combine_hooks
from hybridrl.autotune.adaptive_accumulation import AccumulationControl
from hybridrl.autotune.grad_noise import NoiseScaleMonitor
from hybridrl.modeling.sequences import response_log_probs


@dataclass(frozen=True)
class PolicyLossSettings:
    """What the actor's loss needs besides the batch (from ``ActorConfig`` and the data config)."""

    policy_loss: str = "vanilla"
    loss_agg_mode: str = "token-mean"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    loss_scale_factor: Optional[float] = None  # the constant horizon of seq-mean-token-sum-norm (max response length)

    @classmethod
    def from_config(cls, actor: ActorConfig, max_response_length: int) -> "PolicyLossSettings":
        return cls(policy_loss=actor.policy_loss, loss_agg_mode=actor.loss_agg_mode,
                   clip_ratio_low=actor.clip_ratio_low, clip_ratio_high=actor.clip_ratio_high,
                   clip_ratio_c=actor.clip_ratio_c, entropy_coeff=actor.entropy_coeff, use_kl_loss=actor.use_kl_loss,
                   kl_loss_coef=actor.kl_loss_coef, kl_loss_type=actor.kl_loss_type,
                   loss_scale_factor=float(max_response_length))


def sampling_temperature(batch: Batch) -> float:
    """The temperature the rollout sampled with (``meta["temperature"]``, default 1)."""
    return float(batch.meta.get("temperature", 1.0))


class PolicyEngine:
    """Log-probs and updates for one policy model on one rank.

    Args:
        model: the causal LM, already sharded (or a plain module on a single process).
        optimizer, scheduler: from ``hybridrl.engines.optim`` (``None`` for a frozen reference policy).
        dp: this rank's data-parallel group.
        packed: forward without pad tokens (``model.use_remove_padding``).
        share_prompts: run the responses to one prompt over a single copy of it (``model.share_prompts``).
        grad_clip: maximum global gradient norm (``actor.grad_clip``).
        grad_noise_scale: measure each micro-batch's gradient and log the noise scale (``actor.log_grad_noise_scale``).
    """

    def __init__(self, model: nn.Module, *, dp: DataParallelGroup, packed: bool = False, share_prompts: bool = False,
                 optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None, grad_clip: float = 1.0,
                 grad_noise_scale: bool = False) -> None:
        self.model = model
        self.grad_clip = grad_clip
        self.accumulation: Optional[AccumulationControl] = None
        self.noise_monitor: Optional[NoiseScaleMonitor] = NoiseScaleMonitor(model, dp) if grad_noise_scale else None
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.dp = dp
        self.packed = packed
        self.share_prompts = share_prompts
        self.ewc: Optional[EWCRegularizer] = None

    def enable_ewc(self, coef: float, batches: list[Batch], micro_batching: MicroBatching) -> None:
        """Anchor EWC at the current weights, with the Fisher estimated from ``batches`` (this rank's part of each;
        prompt + response rows, e.g. the first step's rollouts). Every later ``update_policy`` adds the penalty."""
        self.model.train()
        self.ewc = EWCRegularizer(self.model, coef, self.dp)
        self.ewc.estimate_fisher(self.model, batches, self.sft_loss(), micro_batching)

    def use_adaptive_accumulation(self, control: AccumulationControl) -> None:
        """Let ``control`` (built on this engine's optimizer and scheduler) choose ``update_policy``'s accumulation
        steps; turns the noise-scale measurement on, which it feeds on."""
        if self.noise_monitor is None:
            self.noise_monitor = NoiseScaleMonitor(self.model, self.dp)
        self.accumulation = control

    def compute_log_prob(self, data: Batch, micro_batching: MicroBatching, *, with_entropy: bool = True) -> Batch:
        """Log-probs (and entropy) of ``data``'s responses: a Batch with ``old_log_probs [B, R]`` (+ ``entropy``)."""
        response_length = data[Fields.RESPONSES].shape[-1]

        def forward(micro_batch: Batch) -> dict[str, torch.Tensor]:
            log_prob, entropy = response_log_probs(
                self.model, micro_batch[Fields.INPUT_IDS], micro_batch[Fields.ATTENTION_MASK], response_length,
                temperature=sampling_temperature(data), packed=self.packed, share_prompts=self.share_prompts,
                with_entropy=with_entropy)
            return {Fields.OLD_LOG_PROBS: log_prob, **({Fields.ENTROPY: entropy} if with_entropy else {})}

        return forward_micro_batches(self.model, data, micro_batching, self.dp, forward)

    def micro_batch_loss(self, settings: PolicyLossSettings, temperature: float):
        """The loss function of one micro-batch under ``settings`` (see ``accumulation.MicroBatchLoss``)."""

        def loss_fn(micro_batch: Batch, normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            response_mask = micro_batch[Fields.RESPONSE_MASK]
            log_prob, entropy = response_log_probs(
                self.model, micro_batch[Fields.INPUT_IDS], micro_batch[Fields.ATTENTION_MASK],
                response_mask.shape[-1], temperature=temperature, packed=self.packed,
                share_prompts=self.share_prompts, with_entropy=True, entropy_grad=settings.entropy_coeff != 0)
            aggregate = dict(response_mask=response_mask, mode=settings.loss_agg_mode, normalizer=normalizer,
                             loss_scale_factor=settings.loss_scale_factor)
            # Without old log-probs the update is exactly on-policy (checked in update_policy): π_old = π_θ.
            old_log_prob = micro_batch[Fields.OLD_LOG_PROBS] if Fields.OLD_LOG_PROBS in micro_batch else log_prob.detach()
            loss, metrics = POLICY_LOSSES[settings.policy_loss](
                old_log_prob=old_log_prob, log_prob=log_prob,
                advantages=micro_batch[Fields.ADVANTAGES], response_mask=response_mask,
                clip_ratio_low=settings.clip_ratio_low, clip_ratio_high=settings.clip_ratio_high,
                clip_ratio_c=settings.clip_ratio_c, loss_agg_mode=settings.loss_agg_mode, normalizer=normalizer,
                loss_scale_factor=settings.loss_scale_factor)
            metrics = {name: float(value) for name, value in metrics.items()}
            metrics["entropy"] = float(masked_mean(entropy.detach(), response_mask))
            if settings.entropy_coeff != 0:
                loss = loss - settings.entropy_coeff * aggregate_loss(entropy, **aggregate)
            if settings.use_kl_loss:
                kl = kl_penalty(log_prob, micro_batch[Fields.REF_LOG_PROBS], settings.kl_loss_type)
                loss = loss + settings.kl_loss_coef * aggregate_loss(kl, **aggregate)
                metrics["kl_loss"] = float(masked_mean(kl.detach(), response_mask))
            return loss, metrics

        return loss_fn

    def sft_loss(self):
        """Supervised loss of one micro-batch: negative log-likelihood of the response tokens, token-mean over the
        whole mini-batch (global normaliser), so SFT accumulation is exact too."""

        def loss_fn(micro_batch: Batch, normalizer: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            response_mask = micro_batch[Fields.RESPONSE_MASK]
            log_prob, _ = response_log_probs(self.model, micro_batch[Fields.INPUT_IDS],
                                             micro_batch[Fields.ATTENTION_MASK], response_mask.shape[-1],
                                             packed=self.packed, share_prompts=self.share_prompts)
            loss = aggregate_loss(-log_prob, response_mask, "token-mean", normalizer=normalizer)
            return loss, {"sft_loss": float(masked_mean(-log_prob.detach(), response_mask))}

        return loss_fn

    def update_sft(self, data: Batch, micro_batching: MicroBatching) -> dict:
        """One optimizer step of supervised fine-tuning on this rank's ``data`` (prompt + target response rows)."""
        if self.optimizer is None:
            raise RuntimeError("this PolicyEngine has no optimizer")
        self.model.train()
        return train_mini_batch(self.model, self.optimizer, self.scheduler, data, self.sft_loss(),
                                loss_agg_mode="token-mean", micro_batching=micro_batching, dp=self.dp,
                                grad_clip=self.grad_clip)

    def update_policy(self, data: Batch, settings: PolicyLossSettings, micro_batching: MicroBatching, *,
                      local_mini_batch_size: int, epochs: int = 1, shuffle: bool = False, seed: int = 0,
                      ptx: Optional[Batch] = None, ptx_coef: float = 0.0) -> dict:
        """PPO epochs over this rank's part of the step's data; one optimizer step per mini-batch.

        ``data`` needs ``input_ids``, ``attention_mask``, ``responses``, ``response_mask``, ``advantages``,
        ``old_log_probs`` (optional for exactly one epoch over one mini-batch: then π_old = π_θ, detached) and
        ``ref_log_probs`` with a KL loss. ``ptx``: this rank's SFT rows for the step, mixed into
        every optimizer step with weight ``ptx_coef`` (``anti_forgetting.PtxMixer``). Returns metrics averaged over
        optimizer steps. With adaptive accumulation the control's ``micro × K`` replaces ``local_mini_batch_size``,
        its scaled schedule steps the learning rate, and ``K`` is reconsidered after the update.
        """
        if self.optimizer is None:
            raise RuntimeError("this PolicyEngine has no optimizer (a reference policy cannot be updated)")
        loss_fn = self.micro_batch_loss(settings, sampling_temperature(data))
        monitor = self.noise_monitor
        if monitor is not None:
            loss_fn = monitor.wrap(loss_fn, settings.loss_agg_mode)
        control, scheduler = self.accumulation, self.scheduler
        if control is not None:
            local_mini_batch_size, scheduler = control.local_mini_batch_size, control.schedule
            control.schedule.apply()
        if Fields.OLD_LOG_PROBS not in data and (epochs != 1 or local_mini_batch_size != len(data)):
            raise ValueError(f"no old_log_probs: only an on-policy update (one epoch over one mini-batch) may use its "
                             f"own log-probs, but this one has {epochs} epoch(s) over mini-batches of "
                             f"{local_mini_batch_size} of {len(data)} rows")
        mixer = None
        if ptx is not None and ptx_coef > 0:
            mixer = PtxMixer(self.model, ptx, len(data) // local_mini_batch_size, self.sft_loss(), ptx_coef,
                             micro_batching, self.dp)
        ewc = self.ewc
        metrics = train_epochs(self.model, self.optimizer, scheduler, data, loss_fn,
                               loss_agg_mode=settings.loss_agg_mode, micro_batching=micro_batching, dp=self.dp,
                               grad_clip=self.grad_clip, local_mini_batch_size=local_mini_batch_size, epochs=epochs,
                               shuffle=shuffle, seed=seed, group_prompts=self.share_prompts and not self.packed,
                               after_step=None if monitor is None else monitor.after_step,
                               before_step=combine_hooks(mixer, None if ewc is None else lambda _: ewc.add_gradient()))
        if control is not None:
            metrics.update(control.metrics())
            if monitor.norms.global_batch_size is not None:
                control.update(monitor.norms.global_batch_size, monitor.estimator.latest)
        return metrics
