"""The preference-optimisation trainer's configuration (``conf/dpo_trainer.yaml``): DPO, cDPO, IPO, SimPO and ORPO
on preference pairs, on the same FSDP2 worker stack and gradient-accumulation loop as the actor. Its pairs
(``data.*``) are the reward-model trainer's."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridrl.config.frozen import FreezableConfig
from hybridrl.config.rm_schema import RMDataConfig, RMTrainerConfig
from hybridrl.config.schema import FSDPConfig, ModelConfig, OptimConfig

PREFERENCE_LOSSES = ("dpo", "ipo", "simpo", "orpo", "kto")
"""``loss.type`` choices (``hybridrl.algorithms.preference_optimization``)."""
REFERENCE_FREE_LOSSES = ("simpo", "orpo")
"""Losses that read no reference policy (none is built)."""
REFERENCE_MODES = ("precompute", "on_the_fly")
"""``loss.reference_log_probs`` choices."""


@dataclass
class DPOLossConfig(FreezableConfig):
    type: str = "dpo"
    """``dpo`` (−log σ(β h), ``h`` the implicit reward margin; cDPO with ``label_smoothing``) | ``ipo``
    ((h̄ − 1/(2β))², ``h̄`` of per-token mean log-ratios, as TRL) | ``simpo`` (reference-free:
    −log σ(β (mean log-prob chosen − rejected) − γ)) | ``orpo`` (reference-free: the chosen responses' negative
    log-likelihood, a mean over all their tokens in the step, + β · −log σ(log odds ratio)) | ``kto`` (unpaired rows,
    each desirable or not: λ_D (1 − σ(β (r − z₀))) or λ_U (1 − σ(β (z₀ − r))), ``r`` the row's log-ratio and ``z₀``
    the step's KL estimate from mismatched completions; ``hybridrl.data.unpaired``)."""
    beta: float = 0.1
    """β > 0: the strength of the implicit KL constraint (SimPO: the reward scale; ORPO: λ, the odds-ratio term's
    weight)."""
    label_smoothing: float = 0.0
    """cDPO: the assumed share of flipped labels, in [0, 0.5) (``dpo`` only; 0: plain DPO)."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin γ ≥ 0."""
    desirable_weight: float = 1.0
    """KTO's λ_D > 0, the weight of desirable rows (raise it when they are fewer: TRL suggests
    λ_D·n_D / (λ_U·n_U) in [1, 4/3])."""
    undesirable_weight: float = 1.0
    """KTO's λ_U > 0, the weight of undesirable rows."""
    reference_log_probs: str = "precompute"
    """``precompute``: the reference policy scores the training pairs the run will draw and every held-out pair
    once at start, then is freed
    (its memory goes back before the first step) | ``on_the_fly``: it scores each step's pairs (kept in memory;
    for data too large to score up front). With LoRA (``model.lora.rank > 0``) the reference is the base model with
    the adapters off, no second copy."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; a non-finite norm skips the step."""


@dataclass
class DPOTrainerConfig(RMTrainerConfig):
    experiment_name: str = "dpo"
    """Experiment name (tracking, run directory)."""


@dataclass
class DPOConfig(FreezableConfig):
    """The preference-optimisation trainer's whole configuration."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy to train (a causal LM directory; the reference policy is the same weights, frozen)."""
    data: RMDataConfig = field(default_factory=RMDataConfig)
    """Preference pairs (the reward-model trainer's: files, ranked responses, synthetic pairs, held-out split)."""
    loss: DPOLossConfig = field(default_factory=DPOLossConfig)
    """Which preference loss, its β, the reference policy's log-probs, clipping."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6, weight_decay=0.0))
    """Optimizer and schedule."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 sharding settings (``optimizer_offload`` does not apply: the optimizer steps every step;
    ``param_offload`` keeps parameters, gradients and the optimizer step on the host)."""
    trainer: DPOTrainerConfig = field(default_factory=DPOTrainerConfig)
    """Devices, steps, validation, checkpoints, logging."""
