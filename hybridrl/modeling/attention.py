"""The attention kernel a model runs: ``model.attn_implementation=auto`` picks per device, and on CPU per shape.

On CPU, PyTorch's fused SDPA kernel (flash-style, bf16) is several times slower than the plain matmul-softmax-matmul
for the short sequences RL post-training on a CPU sees, and faster for long ones. Measured on a 2-core AMD EPYC,
bf16, 9 heads × 64, forward + backward: 8 × 32 tokens 3.0 ms vs 1.0 ms eager; 8 × 128: 19 vs 13 ms; 4 × 256: 18 vs
20 ms; 1 × 1024: 52 vs 92 ms. One decode step (1 query over 100–4000 keys, no grad) is 5–6× faster eager. So the CPU
kernel registered here (``hybridrl_cpu``) computes attention directly when a head's score matrix has at most
``EAGER_MAX_SCORES`` entries and hands everything else to transformers' SDPA path; both are exact attention (softmax in
fp32), with the same masks (transformers builds them as for ``sdpa``: padding, packed sequences, caches).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Optional

import torch
from torch import nn

logger = logging.getLogger(__name__)

CPU_ATTENTION = "hybridrl_cpu"
EAGER_MAX_SCORES = 192 * 192
"""Largest ``query_length × key_length`` computed directly on CPU (the measured crossover lies between 128² and 256²)."""


def attention_implementation(requested: str, device_type: str, compute_dtype: Optional[torch.dtype] = None) -> str:
    """The transformers ``attn_implementation`` to build a model with.

    ``auto``: on CUDA, ``flash_attention_2`` when flash-attn is installed and the compute dtype is bf16/fp16, else
    ``sdpa``; on CPU, :data:`CPU_ATTENTION` (registered with transformers here). ``flash_attention_2`` off CUDA or
    without flash-attn falls back to ``sdpa`` with a warning rather than failing deep inside transformers. Anything
    else is passed through.
    """
    if requested == "auto":
        if device_type == "cuda":
            half = compute_dtype in (torch.bfloat16, torch.float16)
            return "flash_attention_2" if half and importlib.util.find_spec("flash_attn") is not None else "sdpa"
        register_cpu_attention()
        return CPU_ATTENTION
    if requested != "flash_attention_2":
        return requested
    if device_type != "cuda":
        logger.warning("model.attn_implementation=flash_attention_2 needs a CUDA device; using sdpa on %s", device_type)
        return "sdpa"
    if importlib.util.find_spec("flash_attn") is None:
        logger.warning("model.attn_implementation=flash_attention_2 but flash-attn is not installed; using sdpa")
        return "sdpa"
    return requested


def register_cpu_attention() -> None:
    """Register :data:`CPU_ATTENTION` with transformers' attention and mask interfaces (idempotent; per process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(CPU_ATTENTION, cpu_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_ATTENTION, sdpa_mask)


def computes_directly(attention: str, row_length: int) -> bool:
    """Whether a model built with ``attention`` (a resolved name) computes attention over rows of ``row_length``
    tokens itself rather than through sdpa (what the memory model needs to know: it saves the score matrices)."""
    return attention == CPU_ATTENTION and row_length * row_length <= EAGER_MAX_SCORES


def cpu_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                          scaling: Optional[float] = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query [B, H, q, D]``, ``key``/``value [B, H_kv, k, D]``,
    ``attention_mask`` as for SDPA (bool ``[B, 1, q, k]``, True = attend; or ``None`` = causal) → ``([B, q, H, D],
    None)``. Small score matrices are computed here, the rest by transformers' SDPA function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_length, k_length = query.shape[2], key.shape[2]
    # soft-capping, attention sinks, position biases and paged caches: sdpa's function handles (or refuses) them
    special = any(kwargs.get(name) is not None for name in ("softcap", "s_aux", "position_bias", "cache"))
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    if q_length * k_length > EAGER_MAX_SCORES or special or not causal:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return direct_attention(query, key, value, attention_mask, scaling=scaling,
                            dropout=dropout if module.training else 0.0), None


def direct_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor], *,
                     scaling: Optional[float] = None, dropout: float = 0.0) -> torch.Tensor:
    """softmax(q·kᵀ·scale + mask) · v with the softmax in fp32. Returns ``[B, q, H, D]``.

    ``query [B, H, q, D]``, ``key``/``value [B, H_kv, k, D]`` with ``H = g·H_kv`` (query heads ``j·g … j·g+g−1``
    share KV head ``j``, transformers' grouping). A KV head's ``g`` query heads are folded into its query rows,
    ``[B, H_kv, g·q, D]``, so the keys and values are never repeated ``g`` times: one decode step (q = 1) then
    multiplies g-row blocks instead of 1-row ones. Measured on the 2-core AMD EPYC, bf16, 9 heads over 3 KV heads,
    32 rows, 1 query: 0.53 → 0.27 ms at 65 keys, 32 → 2.7 ms at 1000 (the repeat and the 1-row bmm were the cost);
    forward + backward of 8 × 76 tokens 4.4 → 3.0 ms. Same forward values bit for bit; gradients of K and V are
    summed over the group inside the matmul instead of after it (fp32: within 2e-6).

    ``mask``: bool (True = attend) or additive float, broadcastable to ``[B, H, q, k]``; ``None`` means causal,
    aligned to the last key (a query at position ``i`` of ``q`` sees keys ``≤ i + k − q``). Rows with no visible key
    (left padding's pad queries) get uniform weights instead of NaN, as in eager attention.
    """
    batch, heads, q_length, dim = query.shape
    kv_heads, k_length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    folded = query.reshape(batch, kv_heads, groups * q_length, dim)
    scores = torch.matmul(folded, key.transpose(-1, -2)).view(batch, kv_heads, groups, q_length, k_length)
    if mask is None and q_length > 1:
        mask = torch.ones(q_length, k_length, dtype=torch.bool, device=scores.device).tril(k_length - q_length)
    if mask is None:
        scores = scores.float() * scale
    elif mask.dtype == torch.bool:
        scores = _scaled_and_masked(scores, _grouped_mask(mask, kv_heads, groups), scale)
    else:
        scores = scores.float() * scale + _grouped_mask(mask, kv_heads, groups).float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    if dropout > 0:
        weights = nn.functional.dropout(weights, p=dropout, training=True)
    output = torch.matmul(weights.view(batch, kv_heads, groups * q_length, k_length), value)
    return output.view(batch, heads, q_length, dim).transpose(1, 2).contiguous()


def _scaled_and_masked(scores: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``where(mask, float(scores) · scale, finfo.min)`` in one pass over the score matrix: ``bias + scale · scores``
    with ``bias`` 0 where ``mask`` and fp32's minimum elsewhere, built at the mask's (unrepeated) size. The same
    values bit for bit: ``0 + x`` is ``x``, and the minimum absorbs any score (it moves only past ``|x| ≈ 1e31``);
    fully masked rows get uniform weights as before (a gradient into such a row's scores, which a model never sends,
    now flows as through eager attention's additive mask). It replaces a cast, a multiply and a ``where`` over
    ``[B, H_kv, g, q, k]`` fp32: forward + backward of SmolLM2's attention over 2 × 174 tokens (bf16, 9 heads over
    3 KV heads, 2-core AMD EPYC, alternated in one process) 6.3 → 5.1 ms; decode steps unchanged (0.30–0.41 ms)."""
    bias = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
    return torch.add(bias, scores, alpha=scale)


def _grouped_mask(mask: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor:
    """A mask broadcastable to ``[B, H, q, k]`` → broadcastable to ``[B, H_kv, g, q, k]``."""
    if mask.dim() < 3:
        return mask
    if mask.dim() == 3:
        mask = mask.unsqueeze(0)
    if mask.shape[1] == 1:
        return mask.unsqueeze(2)
    return mask.unflatten(1, (kv_heads, groups))
