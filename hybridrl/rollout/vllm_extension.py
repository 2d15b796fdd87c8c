"""Methods mixed into vLLM's worker class (``LLM(worker_extension_cls=...)``) so the rollout can push new weights.

vLLM resolves :data:`WORKER_EXTENSION` by name inside its worker and adds :class:`WeightSyncExtension` to the worker's
bases; ``llm.collective_rpc("hybridrl_load_weights", args=(...))`` then runs the method with ``self`` = the worker.
This module imports nothing from vLLM: it is loaded by vLLM itself, after vLLM is imported.

Two load paths, chosen by the worker's device:

- **CPU**: the CPU model runner repacks weights into kernel layouts after the first load, so ``model.load_weights``
  on a loaded model corrupts them. ``worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)`` restores
  checkpoint-format layers, loads, and re-runs the per-layer processing. It must see *every* weight in *one* call:
  a fused layer (``qkv_proj`` ← q/k/v) whose parts arrive in different calls would be processed half-loaded.
  The engine therefore passes one lazy iterator, in-process (nothing is pickled, memory stays one layer deep).
- **GPU**: weights keep their checkpoint layout, so ``model.load_weights`` copies each tensor into place; the engine
  sends bounded buckets (lists), one RPC each, which also pickle across vLLM's multi-process executor (TP > 1).
"""

from __future__ import annotations

from typing import Iterable

import torch

WORKER_EXTENSION = "hybridrl.rollout.vllm_extension.WeightSyncExtension"
"""The qualified name vLLM resolves for ``worker_extension_cls``."""


class WeightSyncExtension:
    """Worker-side half of ``VLLMRollout.update_weights``. Names carry a ``hybridrl_`` prefix: vLLM refuses an
    extension whose attributes collide with the worker's own."""

    def hybridrl_load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load (Hugging Face name, full tensor) pairs into the worker's model; returns the number of tensors loaded.

        On CPU ``named_tensors`` must hold the complete set of weights (see the module docstring); on GPU any subset.
        """
        counted = _Counted(named_tensors)
        if self.model_runner.device.type == "cpu":
            self.reload_weights(weights_iterator=iter(counted), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=iter(counted))
        return counted.count


class _Counted:
    """Iterate over ``items`` once, counting them (to check that a sync delivered what it announced)."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.items = items
        self.count = 0

    def __iter__(self):
        for item in self.items:
            self.count += 1
            yield item
