"""The resharder's source for a LoRA actor: base weights under their Hugging Face names, adapted ones merged
(``W' = W + scaling · B A`` row by row, see :mod:`hybridrl.modeling.lora`); the adapters themselves are not sent."""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.hybrid_engine.plan import ParamMeta
from hybridrl.modeling.lora import adapted_layers, full_detached, hf_name, is_adapter_param, merge_rows


class MergedLoraWeights:
    """The rollout engine's view of a LoRA actor, for ``WeightResharder(source=...)``: every base parameter under
    its Hugging Face name, adapted weights merged, adapters themselves not sent.

    ``shards`` gathers each ``lora_A`` (every rank must call it, in the same order) and merges row shards locally.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.layers = {layer.weight: layer for layer in adapted_layers(model)}
        if not self.layers:
            raise ValueError("MergedLoraWeights needs a model with LoRA adapters (none found)")

    def metas(self) -> list[ParamMeta]:
        """``ParamMeta`` (HF name, full shape, dtype) of every non-adapter parameter, in parameter order."""
        return [ParamMeta(hf_name(name), tuple(param.shape), param.dtype)
                for name, param in self.model.named_parameters() if not is_adapter_param(name)]

    def shards(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``local`` (``{peft name: this rank's row shard}`` of every parameter) → ``{hf name: merged row shard}``."""
        params = dict(self.model.named_parameters())
        out = {}
        for name, shard in local.items():
            if is_adapter_param(name):
                continue
            layer = self.layers.get(name)
            if layer is not None:
                shard = merge_rows(shard, local[layer.lora_b], full_detached(params[layer.lora_a]), layer.scaling)
            out[hf_name(name)] = shard
        return out
