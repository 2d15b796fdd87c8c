"""Helpers of the vLLM engine tests (a plain module: ``conftest`` names collide across test folders)."""

from __future__ import annotations

from hybridrl.config.schema import RolloutConfig
from hybridrl.rollout import EngineInputs, build_rollout_engine


def cpu_engine(model_dir, tokenizer, max_model_len: int = 200):
    """An in-process fp32 vLLM engine (CPU build) on ``model_dir``: 64 MiB of KV cache, up to 32 sequences."""
    rollout = RolloutConfig(name="vllm", kv_cache_memory_mb=64, max_num_seqs=32, max_num_batched_tokens=1024)
    return build_rollout_engine("vllm", EngineInputs(
        rollout=rollout, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[tokenizer.eos_token_id],
        model_path=str(model_dir), max_model_len=max_model_len, dtype="float32"))
