"""The vLLM KV cache on CPU: how large it must be for a generation to run in one wave, and how many it holds.

vLLM keeps each running sequence's keys and values in blocks of ``block_size`` tokens; a sequence of up to
``max_model_len`` tokens takes ``ceil(max_model_len / block_size)`` blocks for its whole life, and one block is the
engine's null block. When the cache holds fewer sequences than a generation submits, vLLM runs the rest after the
first ones finish: the decode steps double while each runs fewer rows (measured on SmolLM2-135M, 32 sequences of 77
tokens, 2 CPU cores: a 64 MiB cache held 21, and the generation took 2.8–3.4 s instead of 2.5–2.7 s).

On CPU a budget left unset (``rollout.kv_cache_memory_mb: null``) is sized here to hold ``rollout.max_num_seqs``
sequences of ``max_model_len`` tokens — the most vLLM schedules at once. On GPU vLLM sizes the cache itself from
``rollout.gpu_memory_utilization``.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Optional

import torch

from hybridrl.config.rollout_schema import CPU_KV_BLOCK_SIZE
from hybridrl.utils.host_memory import host_memory_mb

logger = logging.getLogger(__name__)

CPU_BLOCK_SIZE = 128
"""vLLM's own KV block size on CPU when none is asked for (``vllm.platforms.cpu``: 128 tokens)."""

_NULL_BLOCKS = 1


def kv_bytes_per_token(model_path: str, dtype: torch.dtype, tensor_parallel: int = 1) -> Optional[int]:
    """Bytes of keys and values one token takes over all layers on one of ``tensor_parallel`` ranks:
    ``2 · layers · ceil(kv_heads / tensor_parallel) · head_dim · itemsize``, from the checkpoint's ``config.json``
    (``None`` when it does not name these, e.g. latent-attention models)."""
    config_file = Path(model_path) / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    config = config.get("text_config", config)  # a vision-language checkpoint keeps its LM's shape inside
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    if not layers or not heads or config.get("kv_lora_rank"):
        return None
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * layers * math.ceil(kv_heads / tensor_parallel) * head_dim * dtype.itemsize


def resolve_block_size(explicit: Optional[int], *, on_cpu: bool) -> Optional[int]:
    """The KV block size a vLLM engine is started with: ``explicit`` (``rollout.block_size``) if set; else on CPU
    :data:`~hybridrl.config.schema.CPU_KV_BLOCK_SIZE` (32), so that with prefix caching the ``n`` samples of a prompt
    share its whole 32-token blocks — at vLLM's CPU default of 128 a prompt shorter than 128 tokens shares nothing
    and is prefilled ``n`` times (SmolLM2-135M, 8 prompts of 44 tokens × 4 samples × 32 tokens: generation
    2.7–3.1 → 2.0–2.2 s, the same tokens); on GPU ``None`` (vLLM's default)."""
    if explicit is not None:
        return explicit
    return CPU_KV_BLOCK_SIZE if on_cpu else None


def blocks_per_sequence(max_model_len: int, block_size: int) -> int:
    return math.ceil(max_model_len / block_size)


def kv_cache_mb_for(sequences: int, max_model_len: int, bytes_per_token: int,
                    block_size: int = CPU_BLOCK_SIZE) -> int:
    """MiB (rounded up) of KV cache that holds ``sequences`` sequences of up to ``max_model_len`` tokens at once."""
    blocks = sequences * blocks_per_sequence(max_model_len, block_size) + _NULL_BLOCKS
    return math.ceil(blocks * block_size * bytes_per_token / 2**20)


def sequences_held(num_blocks: int, max_model_len: int, block_size: int) -> int:
    """How many sequences of up to ``max_model_len`` tokens a cache of ``num_blocks`` blocks runs at once (without
    counting prefix sharing, which needs whole shared blocks)."""
    return max(num_blocks - _NULL_BLOCKS, 0) // blocks_per_sequence(max_model_len, block_size)


def cache_splits(rows: int, held: int, max_num_seqs: int) -> bool:
    """Whether a cache that runs ``held`` sequences at once is what splits a generation of ``rows`` into waves: not
    when all rows fit, nor when it holds ``max_num_seqs`` — vLLM's scheduler runs at most that many at once whatever
    the cache, by the user's choice."""
    return rows > held and held < max_num_seqs


def waves_warning(rows: int, held: int, *, max_num_seqs: int, budget_mb: int, num_blocks: int, block_size: int,
                  max_model_len: int, mb_needed: Optional[int]) -> Optional[str]:
    """The warning for a generation of ``rows`` sequences on a cache that runs ``held`` at once; ``None`` when the
    cache is not what splits it (:func:`cache_splits`). ``mb_needed``: the budget for ``min(rows, max_num_seqs)``
    sequences."""
    if not cache_splits(rows, held, max_num_seqs):
        return None
    at_once = min(rows, max_num_seqs)
    advice = f"set rollout.kv_cache_memory_mb >= {mb_needed}" if mb_needed else "raise rollout.kv_cache_memory_mb"
    return (f"vLLM's KV cache (rollout.kv_cache_memory_mb={budget_mb}: {num_blocks} blocks of {block_size} tokens) "
            f"runs {held} sequences of up to {max_model_len} tokens at once, but this generation has {rows}: vLLM "
            f"runs it in {math.ceil(rows / max(held, 1))} waves, with more, smaller decode steps; {advice} to run "
            f"{at_once} at once (or leave it unset on CPU, which sizes it for rollout.max_num_seqs sequences)")


def resolve_kv_cache_mb(explicit_mb: Optional[int], *, model_path: str, dtype: torch.dtype, max_model_len: int,
                        max_num_seqs: int, tensor_parallel: int = 1, on_cpu: bool,
                        block_size: int = CPU_BLOCK_SIZE) -> Optional[int]:
    """The KV budget a vLLM engine is started with: ``explicit_mb`` if set; on GPU ``None`` (vLLM sizes it from
    ``gpu_memory_utilization``); on CPU enough for ``max_num_seqs`` sequences of ``max_model_len`` tokens at once in
    blocks of ``block_size`` tokens, each tensor-parallel rank holding its share of the KV heads — at most a quarter
    of this machine's memory."""
    if explicit_mb is not None or not on_cpu:
        return explicit_mb
    per_token = kv_bytes_per_token(model_path, dtype, tensor_parallel)
    if per_token is None:
        raise ValueError(f"rollout.kv_cache_memory_mb: cannot size vLLM's KV cache for {model_path} (its "
                         "config.json names no layer and head counts); set it, e.g. rollout.kv_cache_memory_mb=256")
    wanted = kv_cache_mb_for(max_num_seqs, max_model_len, per_token, block_size)
    ceiling = host_memory_mb() // 4
    budget = min(wanted, ceiling)
    logger.info("rollout.kv_cache_memory_mb unset on CPU → %d MiB: %d sequences (rollout.max_num_seqs) × %d tokens "
                "(%d rounded up to %d-token blocks) × %.1f KiB per token%s", budget, max_num_seqs,
                blocks_per_sequence(max_model_len, block_size) * block_size, max_model_len, block_size,
                per_token / 1024, f", capped at a quarter of this machine's memory (wanted {wanted} MiB)"
                if budget < wanted else "")
    return budget


def kv_cache_blocks(llm) -> Optional[tuple[int, int]]:
    """``(num_blocks, block_size)`` of a started in-process ``vllm.LLM``'s KV cache (``None`` if not known)."""
    cache_config = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    num_blocks = getattr(cache_config, "num_gpu_blocks", None)
    return (num_blocks, cache_config.block_size) if num_blocks else None
