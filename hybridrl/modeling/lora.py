"""LoRA adapters on the actor (PEFT): building them, the reference policy as the adapter-free base, merged weights.

With ``model.lora.rank > 0`` the actor is ``peft.get_peft_model(hf_model, LoraConfig(...))``: the base weights are
frozen and only the adapters ``lora_A [r, in]`` / ``lora_B [out, r]`` train, so an adapted linear layer computes
``x W^T + scaling · (x A^T) B^T`` with ``scaling = alpha / r``. Everything downstream needs one of two views:

- the **reference policy** is the base model: the same module run under :func:`adapters_disabled` (no second copy);
- the **rollout engine and HF export** need plain Hugging Face weights: ``W' = W + scaling · B A`` under the base
  model's names (:func:`hf_name` strips PEFT's ``base_model.model.`` prefix and ``.base_layer`` infix).

Under FSDP2 every parameter is row-sharded (``Shard(0)``) with ``torch.chunk`` semantics. ``W [out, in]`` and
``B [out, r]`` have the same number of rows, so a rank holds the *same* rows of both, and its rows of ``W'`` are
``W_rows + scaling · B_rows A`` — only ``A`` (``r × in``, tiny) is gathered (:class:`hybridrl.hybrid_engine.lora_weights.MergedLoraWeights`).
PEFT is imported here and nowhere else (an optional extra: ``pip install 'hybridrl[lora]'``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from hybridrl.config.schema import LoraConfig
from hybridrl.utils.distributed import full_tensor

ADAPTER = "default"
PEFT_PREFIX = "base_model.model."


def lora_enabled(lora: LoraConfig) -> bool:
    return lora.rank > 0


def apply_lora(model: nn.Module, lora: LoraConfig) -> nn.Module:
    """Wrap a causal LM with fresh LoRA adapters (``B = 0``, so the wrapped model computes exactly the base model).

    Returns the ``PeftModelForCausalLM``; base parameters are frozen, adapter parameters train.
    """
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
    except ImportError as error:  # pragma: no cover - the extra is part of the test install
        raise ImportError("model.lora.rank > 0 needs PEFT: pip install 'hybridrl[lora]'") from error
    targets = list(lora.target_modules)
    peft_config = PeftLoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                                 task_type="CAUSAL_LM",
                                 target_modules="all-linear" if targets == ["all-linear"] else targets)
    try:
        return get_peft_model(model, peft_config)
    except ValueError as error:
        raise ValueError(f"model.lora.target_modules={targets}: {error}") from error


@dataclass(frozen=True)
class AdaptedLayer:
    """One linear layer with an adapter: parameter names (PEFT names) and its ``scaling`` (``alpha / r``)."""

    weight: str
    lora_a: str
    lora_b: str
    scaling: float


def adapted_layers(model: nn.Module) -> list[AdaptedLayer]:
    """Every adapted linear layer of a PEFT model, in module order (empty for a plain model)."""
    from peft.tuners.lora import LoraLayer

    layers = []
    for prefix, module in model.named_modules():
        if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
            if getattr(module, "fan_in_fan_out", False):
                raise ValueError(f"LoRA layer {prefix!r} stores its weight transposed (fan_in_fan_out); only "
                                 f"nn.Linear-style layers are supported")
            layers.append(AdaptedLayer(weight=f"{prefix}.base_layer.weight", lora_a=f"{prefix}.lora_A.{ADAPTER}.weight",
                                       lora_b=f"{prefix}.lora_B.{ADAPTER}.weight",
                                       scaling=float(module.scaling[ADAPTER])))
    return layers


def is_adapter_param(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` → ``model.layers.0.self_attn.q_proj.weight``."""
    name = peft_name[len(PEFT_PREFIX):] if peft_name.startswith(PEFT_PREFIX) else peft_name
    return name.replace(".base_layer.", ".")


def merge_rows(weight_rows: torch.Tensor, lora_b_rows: torch.Tensor, lora_a: torch.Tensor,
               scaling: float) -> torch.Tensor:
    """``W_rows + scaling · B_rows A``: ``[k, in]`` rows of the merged weight from the same ``k`` rows of ``W`` and
    ``B [k, r]`` and the whole ``A [r, in]`` (computed in fp32, returned in ``W``'s dtype)."""
    if weight_rows.shape[0] != lora_b_rows.shape[0]:
        raise AssertionError(f"row shards differ: W has {weight_rows.shape[0]} rows here, lora_B {lora_b_rows.shape[0]}")
    delta = lora_b_rows.float() @ lora_a.float()
    return (weight_rows.float() + scaling * delta).to(weight_rows.dtype)


def full_detached(param: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP2-sharded) parameter; a collective on every rank for a DTensor."""
    return full_tensor(param).detach()


def merged_state_dict(state: dict[str, torch.Tensor], layers: list[AdaptedLayer]) -> dict[str, torch.Tensor]:
    """A full PEFT state dict (``full_state_dict`` of the actor) → the merged Hugging Face state dict."""
    merged = {layer.weight: merge_rows(state[layer.weight], state[layer.lora_b], state[layer.lora_a], layer.scaling)
              for layer in layers}
    return {hf_name(name): merged.get(name, tensor) for name, tensor in state.items() if not is_adapter_param(name)}


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (the reference policy) for the duration of the block."""
    with model.disable_adapter():
        yield
