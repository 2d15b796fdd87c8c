"""One training engine for every trained role (policy, value, reward model, SFT) on one data-parallel rank.

:meth:`TrainingEngine.optimizer_step` is the whole path of one mini-batch, top to bottom:

1. the mini-batch's **global** normaliser: its valid tokens, sequences or pairs over every micro-batch and every
   data-parallel rank (one all-reduce);
2. its micro-batches (a fixed number of sequences or a token budget; every rank cuts as many);
3. for each micro-batch: the loss's share of the mini-batch loss (already divided by the global normaliser), then
   backward — with FSDP2's gradient reduction on for this backward or off (``grad_sync=step``: only the last
   micro-batch reduces; ``micro_batch``: each one, into the sharded gradients);
4. the hooks' gradient terms (PPO-ptx, EWC);
5. clip the global gradient norm and step the optimizer and the learning rate (a non-finite norm skips the step and
   leaves the weights as they were).

Why each micro-batch's loss is multiplied by the DP size before backward: FSDP2 *averages* gradients over the DP
ranks, but the loss is already divided by the global count, so the *sum* over ranks is wanted; ``× dp.size`` turns
FSDP2's average back into that sum (a reduce with divide factor 1 would need PREMUL_SUM, which gloo lacks). The update
then equals one big batch on one device: ``tests/distributed/test_grad_accum_invariance.py`` checks it against a plain
PyTorch reference for every DP size × micro-batching × layout × loss mode.

No Ray here: a Ray role (:mod:`hybridrl.workers`) owns one engine per process, and the tests drive engines directly
in gloo process groups.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Optional

import torch
from torch import nn

from hybridrl.engines.hooks import StepHook
from hybridrl.engines.losses import ADDITIVE_METRICS, Loss, global_normalizer, metric_weight
from hybridrl.engines.micro_batches import DataParallelGroup, MicroBatching, iterate_mini_batches, split_micro_batches
from hybridrl.engines.optim import clipped_step
from hybridrl.engines.precision import learning_rate
from hybridrl.modeling.fsdp import parameters_kept_gathered, set_gradient_sync, syncs_gradients
from hybridrl.protocol import Batch


class TrainingEngine:
    """A model and what trains it on one rank.

    Args:
        model: the model, already sharded (FSDP2), or a plain module on a single process.
        dp: this rank's data-parallel group.
        micro_batching: how ``optimizer_step`` cuts a mini-batch (``*.ppo_micro_batch_size_per_gpu`` or the token
            budget, ``*.fsdp.grad_sync``, ``*.fsdp.gather_once``); a worker may replace it once an ``auto`` size is
            resolved.
        optimizer, scheduler: from :mod:`hybridrl.engines.optim`; ``None`` for a frozen model (forward passes only).
            ``lr_schedule`` is what each step advances — the scheduler, unless adaptive accumulation wraps it.
        grad_clip: maximum global gradient norm.
        hooks: :class:`~hybridrl.engines.hooks.StepHook` plug-ins run by every optimizer step, in this order.
    """

    def __init__(self, model: nn.Module, *, dp: DataParallelGroup, micro_batching: Optional[MicroBatching] = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, scheduler=None, grad_clip: float = 1.0,
                 hooks: Sequence[StepHook] = ()) -> None:
        self.model = model
        self.dp = dp
        self.micro_batching = micro_batching
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.lr_schedule = scheduler
        self.grad_clip = grad_clip
        self.hooks: list[StepHook] = list(hooks)
        self.last_normalizer = math.nan
        """The global normaliser of the last mini-batch accumulated (its loss tokens, sequences or pairs)."""

    # ------------------------------------------------------------------------------------------ the optimizer step
    def optimizer_step(self, mini_batch: Batch, loss: Loss, *, mini_batch_index: int = 0,
                       hooks: Optional[Sequence[StepHook]] = None) -> dict[str, float]:
        """One optimizer step over this rank's part of ``mini_batch`` (steps 1–5 of the module docstring).

        ``hooks``: the step's plug-ins (default: the engine's own). Returns the mini-batch's metrics: the loss and
        its shares summed over micro-batches and ranks, every other metric a token- (or pair-) weighted mean, plus
        ``grad_norm`` (before clipping), ``lr``, ``skipped_step`` (1 when the norm was not finite) and
        ``empty_step`` (1 when no rank had anything in the loss: no optimizer or schedule step is taken).
        """
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer: it serves forward passes only")
        hooks = self.hooks if hooks is None else hooks
        metrics = self.accumulate_gradients(mini_batch, loss, hooks)
        if self.last_normalizer == 0:  # nothing in the loss on any rank: no step (AdamW would still move the weights)
            self.optimizer.zero_grad(set_to_none=True)
            metrics.update(grad_norm=0.0, lr=learning_rate(self.optimizer), skipped_step=0.0, empty_step=1.0)
            return metrics
        for hook in hooks:
            metrics.update(hook.before_clip(self, mini_batch_index))
        result = clipped_step(self.model, self.optimizer, self.lr_schedule, self.grad_clip)
        metrics.update(grad_norm=result.grad_norm, lr=result.lr, skipped_step=float(not result.applied),
                       empty_step=0.0)
        for hook in hooks:
            metrics.update(hook.after_step(metrics))
        return metrics

    def accumulate_gradients(self, mini_batch: Batch, loss: Loss,
                             hooks: Sequence[StepHook] = ()) -> dict[str, float]:
        """Steps 1–3: forward and backward every micro-batch of this rank's part of ``mini_batch``, gradients left in
        ``.grad`` (reduced across ranks as ``grad_sync`` says). Returns the mini-batch's metrics (see above)."""
        micro_batching = self.micro_batching
        normalizer = global_normalizer(mini_batch, loss.agg_mode, self.dp)
        self.last_normalizer = float(normalizer)
        micro_batches, _ = split_micro_batches(mini_batch, micro_batching, self.dp)
        totals = MetricTotals()
        with _gathered_if(self.model, micro_batching.gather_once, through_backward=True):
            for index, micro_batch in enumerate(micro_batches):
                for hook in hooks:
                    hook.before_micro_batch(micro_batch, normalizer, loss.agg_mode, self.dp.size)
                # Set before the forward: FSDP2 reads it when this micro-batch's backward finishes.
                syncs = syncs_gradients(micro_batching.grad_sync, index, len(micro_batches))
                last = index == len(micro_batches) - 1  # HSDP's all-reduce across groups: once, with the last
                set_gradient_sync(self.model, syncs, all_reduce=last if micro_batching.defer_all_reduce else syncs)
                share, metrics = loss(self.model, micro_batch, normalizer)
                (share * self.dp.size).backward()  # FSDP2 averages over ranks; × size makes that the sum
                totals.add(metrics, metric_weight(micro_batch, loss.agg_mode))
        return totals.over_ranks(self.dp)

    # ------------------------------------------------------------------------------------------ around it
    def train_epochs(self, data: Batch, loss: Loss, *, mini_batch_size: int, epochs: int = 1, shuffle: bool = False,
                     seed: int = 0, group_prompts: bool = False, hooks: Sequence[StepHook] = ()) -> dict[str, float]:
        """PPO-style epochs over this rank's ``data``: one :meth:`optimizer_step` per ``mini_batch_size`` rows,
        shuffled per epoch (seeded by ``seed``); ``group_prompts`` puts each shuffled mini-batch back in prompt order
        (shared prompts). The loss checks the update first (``check_update``: a policy loss without old log-probs
        refuses anything but one epoch over one mini-batch). ``hooks`` (this update's, e.g. PPO-ptx) run before the
        engine's own. Returns the metrics averaged over optimizer steps (``skipped_step`` summed), then what the
        hooks' ``after_update`` add."""
        loss.check_update(data, epochs=epochs, mini_batch_size=mini_batch_size)
        hooks = [*hooks, *self.hooks]
        self.model.train()
        for hook in hooks:
            hook.before_update(self)
        mini_batches = iterate_mini_batches(data, mini_batch_size, epochs=epochs, shuffle=shuffle, seed=seed,
                                            group_prompts=group_prompts)
        per_epoch = len(mini_batches) // max(epochs, 1)
        per_step = [self.optimizer_step(mini_batch, loss, mini_batch_index=index % per_epoch, hooks=hooks)
                    for index, mini_batch in enumerate(mini_batches)]
        metrics = average_over_steps(per_step)
        for hook in hooks:
            metrics.update(hook.after_update(metrics))
        return metrics

    @torch.no_grad()
    def forward(self, data: Batch, micro_batching: MicroBatching,
                outputs_of: Callable[[Batch], dict[str, torch.Tensor]]) -> Batch:
        """Run a no-grad ``outputs_of(micro_batch) -> {name: [b, ...]}`` over ``data``'s micro-batches in eval mode
        and return the outputs as one Batch in ``data``'s row order (token-budget micro-batches are put back)."""
        was_training = self.model.training
        self.model.eval()
        try:
            micro_batches, restore = split_micro_batches(data, micro_batching, self.dp)
            with _gathered_if(self.model, micro_batching.gather_once):
                outputs = [outputs_of(micro_batch) for micro_batch in micro_batches]
        finally:
            self.model.train(was_training)
        merged = {name: torch.cat([output[name] for output in outputs]) for name in outputs[0]}
        return Batch(tensors={name: value if restore is None else value[restore] for name, value in merged.items()})


class MetricTotals:
    """Per-micro-batch metrics summed on one rank: loss shares (:data:`ADDITIVE_METRICS`) as they are, the rest
    weighted by the micro-batch's valid tokens (or pairs) so their mean is the mini-batch's."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.weight = 0.0

    def add(self, metrics: dict[str, float], weight: float) -> None:
        self.weight += weight
        for name, value in metrics.items():
            scale = 1.0 if name in ADDITIVE_METRICS else weight
            self.totals[name] = self.totals.get(name, 0.0) + float(value) * scale

    def over_ranks(self, dp: DataParallelGroup) -> dict[str, float]:
        """The mini-batch's metrics over all ranks, from one small all-reduce: shares summed, the rest weighted means."""
        names = sorted(self.totals)
        packed = torch.tensor([self.totals[name] for name in names] + [self.weight], dtype=torch.float64)
        dp.sum(packed)
        denominator = max(float(packed[-1]), 1.0)
        return {name: float(packed[i]) / (1.0 if name in ADDITIVE_METRICS else denominator)
                for i, name in enumerate(names)}


def average_over_steps(per_step: list[dict[str, float]]) -> dict[str, float]:
    """Mean of each metric over optimizer steps (``skipped_step`` is summed: it is a count)."""
    if not per_step:
        return {}
    names = {name for metrics in per_step for name in metrics}
    averaged = {name: sum(m.get(name, 0.0) for m in per_step) / len(per_step) for name in names}
    averaged["skipped_step"] = sum(m.get("skipped_step", 0.0) for m in per_step)
    return averaged


def _gathered_if(model: nn.Module, enabled: bool, *, through_backward: bool = False):
    """:func:`~hybridrl.modeling.fsdp.parameters_kept_gathered` when ``enabled``, else nothing."""
    return parameters_kept_gathered(model, through_backward=through_backward) if enabled else contextlib.nullcontext()
