"""The gradient-noise scale ``B_simple = tr(Σ) / |G|²`` measured during gradient accumulation, and a rule that adapts
the accumulation steps to it.

McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training" (2018), Appendix A: the squared norm
of a mean gradient over ``B`` independent samples has expectation ``E|G_B|² = |G|² + S / B`` with ``S = tr(Σ)`` the
trace of the per-sample gradient covariance. Two batch sizes ``b < B`` give unbiased estimates

    |G|² ≈ (B·|G_B|² − b·|G_b|²) / (B − b),        S ≈ (|G_b|² − |G_B|²) / (1/b − 1/B),

and ``B_simple = S / |G|²``: around it, doubling the batch stops halving the number of steps. Both estimates are noisy
(``|G|²`` may come out negative), so an exponential moving average is kept of each — never of their ratio, which
is biased and explodes when the ``|G|²`` estimate crosses zero.

**Where the two sizes come from.** ``b`` is one micro-batch on one rank, ``B`` the whole mini-batch over all ranks.
The big gradient norm is the pre-clip norm the optimizer step computes anyway (``clipped_step``). The small one needs
the gradient *increment* of each micro-batch: :class:`MicroBatchGradNorms` registers a hook on every tensor autograd
accumulates into — the plain parameters of an unsharded model, or, under FSDP2, the **unsharded** parameters the
forward actually uses (FSDP2 swaps them into the modules before a layer runs; a forward pre-hook on each module sees
them, so no private FSDP attribute is touched). A leaf-tensor hook receives the gradient of the current backward only,
before it is added to the accumulated one, so each micro-batch's full-model gradient norm on this rank comes without
a snapshot copy, in both the no-sync and the final synced backward. Cost: one squared norm per parameter per
micro-batch, and one 3-float all-reduce per step.

**Units.** The accumulation loop divides every micro-batch loss by the mini-batch's global normaliser ``N`` (tokens
for ``token-mean``, sequences for the ``seq-mean-*`` modes) and multiplies by the DP size ``W``, so the increment of a
micro-batch with ``n`` normaliser units is ``W·n/N`` times that micro-batch's *mean* gradient. :meth:`wrap` undoes
this and records ``b = n``; batch sizes, ``S`` and ``B_simple`` are therefore in normaliser units (tokens under
``token-mean``). Tokens of one sequence are not independent samples, so a token-unit ``S`` is an effective value.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from hybridrl.config.schema import LR_SCALINGS
from hybridrl.protocol import Batch
from hybridrl.engines.accumulation import local_normalizer

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------- estimator
@dataclass(frozen=True)
class GradientSample:
    """One gradient measurement: ``sq_norm = |G_B|²`` of the mean gradient over ``batch_size`` samples."""

    batch_size: float
    sq_norm: float


@dataclass(frozen=True)
class SmallBatchSummary:
    """Sums over the small-batch samples of a step: ``Σ|G_b|²``, ``Σ 1/b``, and their count (over all ranks)."""

    sum_sq_norm: float
    sum_inverse_batch: float
    count: int

    @classmethod
    def of(cls, samples: Sequence[GradientSample]) -> "SmallBatchSummary":
        return cls(sum(s.sq_norm for s in samples), sum(1.0 / s.batch_size for s in samples), len(samples))


def unbiased_estimates(small: SmallBatchSummary, big: GradientSample) -> tuple[float, float]:
    """``(|G|², S)`` from the small samples and the big batch (McCandlish et al., App. A, with several small ones).

    With ``k`` small samples of sizes ``b_i``: ``S = Σ(|G_bi|² − |G_B|²) / Σ(1/b_i − 1/B)`` (unbiased: each term has
    expectation ``S·(1/b_i − 1/B)`` and the denominator is fixed), then ``|G|² = |G_B|² − S/B``. For equal sizes this
    is the paper's pair of formulas with ``|G_b|²`` averaged over the micro-batches.
    """
    spread = small.sum_inverse_batch - small.count / big.batch_size
    if small.count == 0 or spread <= 0:
        raise ValueError(f"the small batches must be smaller than the big one (B={big.batch_size}); with one "
                         "micro-batch on one rank the two sizes coincide and the noise scale is unobservable")
    trace = (small.sum_sq_norm - small.count * big.sq_norm) / spread
    return big.sq_norm - trace / big.batch_size, trace


@dataclass(frozen=True)
class NoiseScaleEstimate:
    """The smoothed ``|G|²`` and ``S`` (bias-corrected EMAs), their ratio ``b_simple`` and the latest raw values.

    ``b_simple`` is ``inf`` while the smoothed ``|G|²`` is not positive (noise dominates the signal).
    """

    gradient_sq: float
    trace: float
    b_simple: float
    raw_gradient_sq: float
    raw_trace: float
    num_updates: int

    def metrics(self, prefix: str = "grad_noise/") -> dict[str, float]:
        return {f"{prefix}gradient_sq": self.gradient_sq, f"{prefix}trace": self.trace,
                f"{prefix}b_simple": self.b_simple}


class GradientNoiseScale:
    """Exponential moving averages of the ``|G|²`` and ``S`` estimates, one update per optimizer step.

    ``ema = decay·ema + (1 − decay)·x``, divided by ``1 − decay^t`` after ``t`` updates (Adam's bias correction), so
    the first estimates are not pulled towards zero.
    """

    def __init__(self, ema_decay: float = 0.95) -> None:
        if not 0 <= ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        self.ema_decay = ema_decay
        self._gradient_sq = 0.0
        self._trace = 0.0
        self.num_updates = 0
        self.latest: Optional[NoiseScaleEstimate] = None

    def update(self, small: SmallBatchSummary | Sequence[GradientSample], big: GradientSample) -> NoiseScaleEstimate:
        """Fold in one step's measurements; returns the new estimate. Non-finite inputs are refused (ValueError)."""
        summary = small if isinstance(small, SmallBatchSummary) else SmallBatchSummary.of(small)
        raw_gradient_sq, raw_trace = unbiased_estimates(summary, big)
        if not (math.isfinite(raw_gradient_sq) and math.isfinite(raw_trace)):
            raise ValueError(f"non-finite gradient-noise inputs: |G|²={raw_gradient_sq}, S={raw_trace}")
        decay = self.ema_decay
        self._gradient_sq = decay * self._gradient_sq + (1 - decay) * raw_gradient_sq
        self._trace = decay * self._trace + (1 - decay) * raw_trace
        self.num_updates += 1
        correction = 1 - decay ** self.num_updates
        gradient_sq, trace = self._gradient_sq / correction, self._trace / correction
        b_simple = trace / gradient_sq if gradient_sq > 0 else math.inf
        self.latest = NoiseScaleEstimate(gradient_sq=gradient_sq, trace=trace, b_simple=b_simple,
                                         raw_gradient_sq=raw_gradient_sq, raw_trace=raw_trace,
                                         num_updates=self.num_updates)
        return self.latest

    def state_dict(self) -> dict[str, float]:
        return {"ema_decay": self.ema_decay, "gradient_sq": self._gradient_sq, "trace": self._trace,
                "num_updates": self.num_updates}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.ema_decay = float(state["ema_decay"])
        self._gradient_sq, self._trace = float(state["gradient_sq"]), float(state["trace"])
        self.num_updates = int(state["num_updates"])


# ----------------------------------------------------------------------------------------- per-micro-batch measuring
class MicroBatchGradNorms:
    """Squared norms of each micro-batch's own (mean) gradient on this rank, from hooks on the tensors autograd
    accumulates into (see the module docstring). Create it after FSDP2 sharding: its forward pre-hooks must run after
    FSDP2's, which swap the unsharded parameters in.

    Use with the accumulation loop unchanged::

        norms = MicroBatchGradNorms(model)
        metrics = train_mini_batch(model, ..., loss_fn=norms.wrap(loss_fn, loss_agg_mode, dp.size), ...)
        summary = summarize(norms.finish(), dp)
        estimate = noise.update(summary, GradientSample(norms.global_batch_size, metrics["grad_norm"] ** 2))
    """

    def __init__(self, model: nn.Module) -> None:
        self._hooked = WeakIdKeyDictionary()
        self._handles = [module.register_forward_pre_hook(self._watch) for module in model.modules()
                         if next(module.parameters(recurse=False), None) is not None]
        self._current: Optional[torch.Tensor] = None  # Σ|grad|² of the open micro-batch, fp64, on the grads' device
        self._open: Optional[tuple[float, float]] = None  # (batch_size, scale) of the open micro-batch
        self._closed: list[tuple[torch.Tensor, float, float]] = []
        self.global_batch_size: Optional[float] = None

    def _watch(self, module: nn.Module, args) -> None:
        for param in module.parameters(recurse=False):
            if param.requires_grad and param not in self._hooked:
                self._hooked[param] = param.register_hook(self._on_grad)

    def _on_grad(self, grad: torch.Tensor) -> None:
        if self._open is None:
            return  # a backward outside a measured micro-batch
        grad = grad.detach()
        dtype = torch.float64 if grad.dtype == torch.float64 else torch.float32  # low precision reduced in fp32
        squared = torch.linalg.vector_norm(grad, dtype=dtype).double() ** 2
        self._current = squared if self._current is None else self._current + squared

    def begin_micro_batch(self, batch_size: float, scale: float) -> None:
        """Start recording a micro-batch of ``batch_size`` samples whose gradient increment is ``1/scale`` times its
        mean gradient (closing the previous one)."""
        self._close()
        self._open = (float(batch_size), float(scale))

    def _close(self) -> None:
        if self._open is not None and self._open[0] > 0 and self._current is not None:
            self._closed.append((self._current, *self._open))
        self._open, self._current = None, None

    def wrap(self, loss_fn, loss_agg_mode: str, dp_size: int = 1):
        """``loss_fn`` (an ``accumulation.MicroBatchLoss``) that also marks each micro-batch's start and scale.

        The accumulation loop backpropagates ``loss · dp_size`` with ``loss`` divided by the global normaliser ``N``,
        so a micro-batch with ``n`` normaliser units contributes ``dp_size · n / N`` times its mean gradient.
        """

        def measured_loss_fn(micro_batch: Batch, normalizer: torch.Tensor):
            count = float(local_normalizer(micro_batch, loss_agg_mode))
            self.global_batch_size = float(normalizer)
            scale = self.global_batch_size / (dp_size * count) if count > 0 else 0.0
            self.begin_micro_batch(count, scale)
            return loss_fn(micro_batch, normalizer)

        return measured_loss_fn

    def finish(self) -> list[GradientSample]:
        """Close the last micro-batch and return this rank's samples (mean-gradient squared norms), one per
        micro-batch with a non-empty normaliser; one device sync."""
        self._close()
        if not self._closed:
            return []
        values = torch.stack([squared for squared, _, _ in self._closed]).tolist()
        samples = [GradientSample(batch_size, value * scale ** 2)
                   for value, (_, batch_size, scale) in zip(values, self._closed)]
        self._closed = []
        return samples

    def remove(self) -> None:
        """Remove every hook (the module pre-hooks and the gradient hooks)."""
        for handle in self._handles:
            handle.remove()
        for handle in list(self._hooked.values()):
            handle.remove()
        self._handles, self._hooked = [], WeakIdKeyDictionary()


def summarize(samples: Sequence[GradientSample], dp=None) -> SmallBatchSummary:
    """The :class:`SmallBatchSummary` of every rank's samples (one 3-float all-reduce when ``dp.size > 1``; on the
    current CUDA device under NCCL, on CPU otherwise)."""
    local = SmallBatchSummary.of(samples)
    if dp is None or dp.size == 1:
        return local
    nccl = dist.get_backend(dp.group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    packed = torch.tensor([local.sum_sq_norm, local.sum_inverse_batch, float(local.count)], dtype=torch.float64,
                          device=device)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=dp.group)
    return SmallBatchSummary(float(packed[0]), float(packed[1]), int(round(float(packed[2]))))


class NoiseScaleMonitor:
    """A training engine's noise-scale measurement: per-micro-batch norms plus the smoothed estimator, in two calls.

    ``loss_fn = monitor.wrap(loss_fn, loss_agg_mode)`` before the accumulation loop, then ``monitor.after_step(m)``
    with each optimizer step's metrics ``m`` (``grad_norm``, ``skipped_step``) — ``train_epochs``' ``after_step``
    hook. Returns ``grad_noise/*`` metrics, or nothing while the step had a single micro-batch on a single rank.
    """

    def __init__(self, model: nn.Module, dp) -> None:
        self.norms = MicroBatchGradNorms(model)
        self.estimator = GradientNoiseScale()
        self.dp = dp

    def wrap(self, loss_fn, loss_agg_mode: str):
        return self.norms.wrap(loss_fn, loss_agg_mode, self.dp.size)

    def after_step(self, step_metrics: dict[str, float]) -> dict[str, float]:
        summary = summarize(self.norms.finish(), self.dp)
        if step_metrics["skipped_step"] or summary.count < 2:  # one micro-batch on one rank: no second batch size
            return {}
        big = GradientSample(self.norms.global_batch_size, step_metrics["grad_norm"] ** 2)
        return self.estimator.update(summary, big).metrics()


# ------------------------------------------------------------------------------------------------ adaptive steps
LrScaling = Literal["linear", "sqrt", "none"]
LR_EXPONENTS = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}
assert tuple(LR_EXPONENTS) == LR_SCALINGS, "the config's lr_scaling names and their exponents must agree"


@dataclass(frozen=True)
class AccumulationDecision:
    """The accumulation steps for the next optimizer steps, and the learning-rate multiplier that goes with them
    (relative to the learning rate configured at ``reference_steps``)."""

    grad_accum_steps: int
    lr_multiplier: float
    batch_size: float
    changed: bool
    reason: str


@dataclass(frozen=True)
class AdaptiveAccumulation:
    """Move the accumulation steps so that the mini-batch follows ``B_simple``, within ``[min_steps, max_steps]``.

    Steps are ``min_steps · 2^k`` (or ``choices``). Nothing changes until the estimator has ``min_updates`` updates,
    nor while ``B_simple`` stays within a factor ``tolerance`` of the current mini-batch (hysteresis: the estimate is
    noisy). Then the steps whose mini-batch is closest to ``B_simple`` in log scale are chosen.

    Learning rate: the configured rate was tuned at ``reference_steps``; at ``k`` steps it is multiplied by
    ``(k / reference_steps)^p``, ``p = 1`` (``linear``: Goyal et al. 2017, SGD below the critical batch),
    ``0.5`` (``sqrt``: Adam-family optimizers; Malladi et al. 2022), or ``0`` (``none``). The multiplier is returned
    with every decision so the caller applies it explicitly.
    """

    min_steps: int
    max_steps: int
    reference_steps: int
    lr_scaling: LrScaling = "sqrt"
    tolerance: float = 2.0
    min_updates: int = 10
    choices: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}, {self.max_steps}")
        if self.reference_steps < 1:
            raise ValueError(f"reference_steps must be >= 1, got {self.reference_steps}")
        if self.lr_scaling not in LR_EXPONENTS:
            raise ValueError(f"lr_scaling must be one of {', '.join(LR_EXPONENTS)}, got {self.lr_scaling!r}")
        if self.tolerance < 1:
            raise ValueError(f"tolerance must be >= 1, got {self.tolerance}")
        if self.choices is not None and not all(self.min_steps <= c <= self.max_steps for c in self.choices):
            raise ValueError(f"choices {self.choices} must lie in [{self.min_steps}, {self.max_steps}]")

    def allowed_steps(self) -> list[int]:
        if self.choices:
            return sorted(set(self.choices))
        steps, allowed = self.min_steps, []
        while steps <= self.max_steps:
            allowed.append(steps)
            steps *= 2
        return allowed

    def lr_multiplier(self, steps: int) -> float:
        return (steps / self.reference_steps) ** LR_EXPONENTS[self.lr_scaling]

    def decide(self, current_steps: int, batch_size: float,
               estimate: Optional[NoiseScaleEstimate]) -> AccumulationDecision:
        """Steps for the next optimizer steps, given the current ones and the last mini-batch's ``batch_size``
        (global normaliser units: tokens or sequences, as ``B_simple``)."""
        per_step = batch_size / current_steps

        def keep(reason: str) -> AccumulationDecision:
            return AccumulationDecision(current_steps, self.lr_multiplier(current_steps), batch_size, False, reason)

        if estimate is None or estimate.num_updates < self.min_updates:
            have = 0 if estimate is None else estimate.num_updates
            return keep(f"waiting for {self.min_updates} noise-scale updates (have {have})")
        target = estimate.b_simple
        if batch_size / self.tolerance <= target <= batch_size * self.tolerance:
            return keep(f"B_simple={target:.4g} is within x{self.tolerance:g} of the mini-batch {batch_size:.4g}")
        allowed = self.allowed_steps()
        if math.isfinite(target):
            desired = math.log(max(target, 1e-12) / per_step)
            best = min(allowed, key=lambda steps: abs(math.log(steps) - desired))
        else:  # |G|² estimate not positive: the gradient is all noise, take the largest batch allowed
            best = allowed[-1]
        if best == current_steps:
            return keep(f"B_simple={target:.4g} asks for {target / per_step:.4g} steps; already at the bound")
        new_batch = best * per_step
        reason = (f"B_simple={target:.4g} vs mini-batch {batch_size:.4g}: grad_accum_steps {current_steps} -> {best} "
                  f"(mini-batch {new_batch:.4g}); lr x{self.lr_multiplier(best):.4g} ({self.lr_scaling} scaling "
                  f"from {self.reference_steps} steps)")
        logger.info("adaptive accumulation: %s", reason)
        return AccumulationDecision(best, self.lr_multiplier(best), new_batch, True, reason)
