"""The gradient-noise scale ``B_simple = tr(Σ) / |G|²`` measured during gradient accumulation (the rule that adapts
the accumulation steps to it is :mod:`hybridrl.autotune.adaptive_accumulation`).

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
micro-batch with ``n`` normaliser units is ``W·n/N`` times that micro-batch's *mean* gradient. :meth:`MicroBatchGradNorms.measure` undoes
this and records ``b = n``; batch sizes, ``S`` and ``B_simple`` are therefore in normaliser units (tokens under
``token-mean``). Tokens of one sequence are not independent samples, so a token-unit ``S`` is an effective value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from hybridrl.engines.hooks import StepHook
from hybridrl.engines.losses import local_normalizer
from hybridrl.protocol import Batch


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

    :class:`NoiseScaleMonitor` drives it from the engine's hooks: :meth:`measure` before each micro-batch, then
    ``summarize(norms.finish(), dp)`` and the step's pre-clip ``grad_norm`` after the optimizer step.
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

    def measure(self, micro_batch: Batch, normalizer: torch.Tensor, agg_mode: str, dp_size: int = 1) -> None:
        """Start measuring ``micro_batch`` of a mini-batch whose global normaliser is ``normalizer``.

        The engine backpropagates ``loss · dp_size`` with ``loss`` divided by the global normaliser ``N``, so a
        micro-batch with ``n`` normaliser units contributes ``dp_size · n / N`` times its mean gradient.
        """
        count = float(local_normalizer(micro_batch, agg_mode))
        self.global_batch_size = float(normalizer)
        scale = self.global_batch_size / (dp_size * count) if count > 0 else 0.0
        self.begin_micro_batch(count, scale)

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


class NoiseScaleMonitor(StepHook):
    """A training engine's noise-scale measurement (``*.log_grad_noise_scale``), as a hook: per-micro-batch norms
    before each micro-batch, the smoothed estimate after each optimizer step (``grad_noise/*`` metrics; nothing
    while a step had a single micro-batch on a single rank). Create it after FSDP2 sharding."""

    def __init__(self, model: nn.Module, dp) -> None:
        self.norms = MicroBatchGradNorms(model)
        self.estimator = GradientNoiseScale()
        self.dp = dp

    def before_micro_batch(self, micro_batch: Batch, normalizer: torch.Tensor, agg_mode: str, dp_size: int) -> None:
        self.norms.measure(micro_batch, normalizer, agg_mode, dp_size)

    def after_step(self, metrics: dict[str, float]) -> dict[str, float]:
        summary = summarize(self.norms.finish(), self.dp)
        if metrics["skipped_step"] or summary.count < 2:  # one micro-batch on one rank: no second batch size
            return {}
        big = GradientSample(self.norms.global_batch_size, metrics["grad_norm"] ** 2)
        return self.estimator.update(summary, big).metrics()
