"""The one way to plug into a training engine's optimizer step: a list of :class:`StepHook` objects.

PPO-ptx (an SFT term), EWC (a pull towards the start weights), the gradient-noise monitor and adaptive accumulation
are hooks; each overrides the moments it needs, in the order the engine reaches them::

    before_update(engine)            once per ``train_epochs`` call, first (adaptive accumulation sets the rates)
    for each optimizer step:
        before_micro_batch(...)      once per micro-batch, before its forward (the noise monitor marks its start)
        before_clip(engine, index)   after the last backward: add gradient terms (ptx, EWC) → metrics
        after_step(metrics)          after clip + step: observe the step (the noise-scale estimate) → metrics
    after_update(metrics)            once per ``train_epochs`` call (adaptive accumulation reconsiders K) → metrics
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from hybridrl.protocol import Batch


class EngineView(Protocol):
    """What a hook may use of the engine that runs it (:class:`~hybridrl.engines.base.TrainingEngine`)."""

    model: nn.Module
    hooks: list["StepHook"]
    lr_schedule: Any

    def accumulate_gradients(self, mini_batch: Batch, loss: Any,
                             hooks: Sequence["StepHook"] = ()) -> dict[str, float]: ...


class StepHook:
    """A plug-in of :class:`~hybridrl.engines.base.TrainingEngine`; every method does nothing unless overridden."""

    def before_update(self, engine: "EngineView") -> None:
        """At the start of a ``train_epochs`` call, before its first optimizer step."""

    def before_micro_batch(self, micro_batch: Batch, normalizer: torch.Tensor, agg_mode: str, dp_size: int) -> None:
        """Before ``micro_batch``'s forward; ``normalizer`` is its mini-batch's global normaliser (``agg_mode``
        units), and the engine will backpropagate ``loss × dp_size``."""

    def before_clip(self, engine: "EngineView", mini_batch_index: int) -> dict[str, float]:
        """After the mini-batch's last backward, before clipping: may add to the gradients. ``mini_batch_index``
        counts the optimizer steps of the current epoch from 0. Returns metrics."""
        return {}

    def after_step(self, metrics: dict[str, float]) -> dict[str, float]:
        """After the optimizer step (``metrics``: the step's, with ``grad_norm`` and ``skipped_step``). Returns more."""
        return {}

    def after_update(self, metrics: dict[str, float]) -> dict[str, float]:
        """After all the optimizer steps of one ``train_epochs`` call (``metrics``: averaged). Returns more."""
        return {}
