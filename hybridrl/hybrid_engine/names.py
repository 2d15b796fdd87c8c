"""Mapping Hugging Face training names to rollout-engine names.

The plan delivers one slice per HF parameter. An engine that keeps HF names (the HF rollout backend; vLLM's
``load_weights``, whose loader does the fusion itself) takes them unchanged: ``identity_name``. An engine that stores
fused tensors (vLLM's ``qkv_proj`` and ``gate_up_proj``) receives each slice with the fused name and a shard id —
the same ``(param_name, weight_name, shard_id)`` table vLLM's Llama/Qwen2 loaders use — via ``fused_name``.

On TP rank ``j`` the fused local tensors are the per-HF-name slices stacked on dim 0 (``fused_row_offsets`` gives
where each lands)::

    qkv_proj.weight[j]     = cat(q_proj[j], k_proj[kv(j)], v_proj[kv(j)])    rows: H/t_g·d | H_kv'·d | H_kv'·d
    gate_up_proj.weight[j] = cat(gate_proj[j], up_proj[j])                   rows: I/t_g   | I/t_g

with ``d`` the head size, ``H_kv' = max(1, H_kv / t_g)`` KV heads per rank and ``kv(j) = j // (t_g / H_kv)`` when
KV heads are replicated (``H_kv < t_g``), else ``j``. Biases (Qwen2) fuse the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

ShardId = Union[str, int, None]

VLLM_FUSED_MODULES: Mapping[str, tuple[str, ShardId]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
"""HF module leaf name → (fused engine module, shard id), as vLLM's Llama/Qwen2 ``stacked_params_mapping``."""


@dataclass(frozen=True)
class EngineName:
    """Where a slice goes in the engine: parameter ``name`` and, for fused tensors, which ``shard_id`` of it."""

    name: str
    shard_id: ShardId = None


NameMap = Callable[[str], EngineName]


def identity_name(hf_name: str) -> EngineName:
    return EngineName(hf_name)


def fused_name(hf_name: str, table: Mapping[str, tuple[str, ShardId]] = VLLM_FUSED_MODULES) -> EngineName:
    """``model.layers.0.self_attn.k_proj.weight`` → ``EngineName("model.layers.0.self_attn.qkv_proj.weight", "k")``."""
    parts = hf_name.split(".")
    if len(parts) >= 2 and parts[-2] in table:
        fused, shard_id = table[parts[-2]]
        return EngineName(".".join(parts[:-2] + [fused, parts[-1]]), shard_id)
    return EngineName(hf_name)


def rename(stream: Iterable[tuple[str, torch.Tensor]],
           name_map: NameMap = identity_name) -> Iterator[tuple[EngineName, torch.Tensor]]:
    """Apply ``name_map`` to a weight stream lazily (the stream's buckets are still pulled one at a time)."""
    for hf_name, tensor in stream:
        yield name_map(hf_name), tensor


def fused_row_offsets(num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                      tp_size: int) -> dict[str, dict[ShardId, tuple[int, int]]]:
    """Row ranges of each shard inside one TP rank's fused tensors: ``{"qkv_proj": {"q": (0, a), "k": ..}, ..}``."""
    kv_per_rank = max(1, num_kv_heads // tp_size)
    q_rows, kv_rows, mlp_rows = num_heads // tp_size * head_dim, kv_per_rank * head_dim, intermediate_size // tp_size
    return {
        "qkv_proj": {"q": (0, q_rows), "k": (q_rows, q_rows + kv_rows),
                     "v": (q_rows + kv_rows, q_rows + 2 * kv_rows)},
        "gate_up_proj": {0: (0, mlp_rows), 1: (mlp_rows, 2 * mlp_rows)},
    }


def engine_name_map(kind: Optional[str]) -> NameMap:
    """``None``/``"hf"`` → identity; ``"vllm_fused"`` → ``fused_name``. ``ValueError`` otherwise."""
    maps: dict[Optional[str], NameMap] = {None: identity_name, "hf": identity_name, "vllm_fused": fused_name}
    if kind not in maps:
        raise ValueError(f"unknown engine name map {kind!r}; expected one of {sorted(k for k in maps if k)}")
    return maps[kind]
