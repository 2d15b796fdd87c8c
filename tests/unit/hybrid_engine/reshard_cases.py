"""Test models for the resharding tests, and the reference slicing they are checked against.

The reference is written the obvious way, independently of ``hybridrl.hybrid_engine``: FSDP shards are
``torch.chunk(full, N)`` (padded with empty shards), TP slices are ``narrow`` calls as in vLLM's weight loaders.
"""

from __future__ import annotations

import torch

from hybridrl.hybrid_engine.plan import ParamMeta

HEAD_DIM = 4


def decoder_metas(hidden: int, heads: int, kv_heads: int, intermediate: int, vocab: int, layers: int = 1,
                  qkv_bias: bool = False, extra_small: bool = False) -> list[ParamMeta]:
    """Llama/Qwen2-named parameter metadata with free shapes (``hidden`` need not be ``heads × HEAD_DIM``)."""
    q_rows, kv_rows = heads * HEAD_DIM, kv_heads * HEAD_DIM
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        shapes.update({
            prefix + "self_attn.q_proj.weight": (q_rows, hidden),
            prefix + "self_attn.k_proj.weight": (kv_rows, hidden),
            prefix + "self_attn.v_proj.weight": (kv_rows, hidden),
            prefix + "self_attn.o_proj.weight": (hidden, q_rows),
            prefix + "mlp.gate_proj.weight": (intermediate, hidden),
            prefix + "mlp.up_proj.weight": (intermediate, hidden),
            prefix + "mlp.down_proj.weight": (hidden, intermediate),
            prefix + "input_layernorm.weight": (hidden,),
            prefix + "post_attention_layernorm.weight": (hidden,),
        })
        if qkv_bias:
            shapes.update({prefix + "self_attn.q_proj.bias": (q_rows,), prefix + "self_attn.k_proj.bias": (kv_rows,),
                           prefix + "self_attn.v_proj.bias": (kv_rows,)})
    if extra_small:  # fewer rows than ranks: empty FSDP shards
        shapes.update({"model.tiny_norm.weight": (3,), "model.wide_norm.weight": (5, 2)})
    shapes.update({"model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)})
    return [ParamMeta(name, shape, torch.float32) for name, shape in shapes.items()]


def full_tensors(metas: list[ParamMeta]) -> dict[str, torch.Tensor]:
    """Distinct values everywhere, so a misplaced element cannot go unnoticed."""
    tensors, offset = {}, 0
    for meta in metas:
        tensors[meta.name] = torch.arange(offset, offset + meta.numel, dtype=torch.float32).reshape(meta.shape)
        offset += meta.numel
    return tensors


def reference_fsdp_shard(full: torch.Tensor, world_size: int, rank: int) -> torch.Tensor:
    chunks = list(torch.chunk(full, world_size, dim=0))
    return chunks[rank] if rank < len(chunks) else full[full.shape[0]:]


def reference_tp_slice(name: str, full: torch.Tensor, tp_size: int, tp_rank: int, kv_heads: int,
                       vocab_pad: int = 64) -> torch.Tensor:
    """The slice vLLM's loaders would narrow out of the full tensor for TP rank ``tp_rank``."""
    module = name.split(".")[-2]
    if module.endswith("norm") or tp_size == 1:
        return full
    if module in ("embed_tokens", "lm_head"):
        per_rank = -(-full.shape[0] // vocab_pad) * vocab_pad // tp_size
        start = min(tp_rank * per_rank, full.shape[0])
        return full[start:min(start + per_rank, full.shape[0])]
    if module in ("k_proj", "v_proj") and kv_heads < tp_size:
        head = tp_rank // (tp_size // kv_heads)
        return full.narrow(0, head * HEAD_DIM, HEAD_DIM)
    if module in ("o_proj", "down_proj"):
        if full.dim() == 1:
            return full
        size = full.shape[1] // tp_size
        return full.narrow(1, tp_rank * size, size)
    size = full.shape[0] // tp_size
    return full.narrow(0, tp_rank * size, size)
