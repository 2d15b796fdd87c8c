"""Sizing vLLM's KV cache on CPU (``rollout.kv_budget``), checked against hand-counted bytes; the real engine's
cache is checked in ``tests/distributed/test_vllm_rollout.py``."""

from __future__ import annotations

import json

import pytest
import torch

from hybridrl.config.rollout_schema import CPU_KV_BLOCK_SIZE
from hybridrl.rollout.kv_budget import (CPU_BLOCK_SIZE, kv_bytes_per_token, kv_cache_mb_for, resolve_block_size,
                                        resolve_kv_cache_mb, sequences_held, waves_warning)

SMOLLM2 = dict(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)


def checkpoint(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_bytes_per_token_count_keys_and_values_of_every_layer(tmp_path):
    path = checkpoint(tmp_path, **SMOLLM2)
    assert kv_bytes_per_token(path, torch.bfloat16) == 2 * 30 * 3 * 64 * 2 == 23040
    assert kv_bytes_per_token(path, torch.float32) == 46080
    assert kv_bytes_per_token(path, torch.bfloat16, tensor_parallel=3) == 2 * 30 * 1 * 64 * 2
    assert kv_bytes_per_token(path, torch.bfloat16, tensor_parallel=2) == 2 * 30 * 2 * 64 * 2  # 3 heads on 2 ranks


def test_bytes_per_token_reads_head_dim_and_nested_text_configs(tmp_path):
    path = checkpoint(tmp_path, text_config=dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                                                 head_dim=32))
    assert kv_bytes_per_token(path, torch.float32) == 2 * 2 * 4 * 32 * 4  # no KV-head count: one per query head


def test_bytes_per_token_unknown_for_latent_attention_or_no_config(tmp_path):
    assert kv_bytes_per_token(str(tmp_path), torch.float32) is None
    path = checkpoint(tmp_path, **SMOLLM2, kv_lora_rank=512)
    assert kv_bytes_per_token(path, torch.float32) is None


def test_budget_rounds_each_sequence_up_to_whole_blocks_plus_the_null_block():
    # 32 sequences of 77 tokens: one 128-token block each, and the null block: 33 · 128 · 23040 bytes = 92.8 MiB
    assert kv_cache_mb_for(32, 77, 23040) == 93
    assert kv_cache_mb_for(32, 129, 23040, block_size=128) == 183  # two blocks each: 65 · 128 · 23040 = 182.8 MiB
    assert sequences_held(22, 77, 128) == 21  # the 64 MiB budget that made vs_trl's generation run in waves
    assert sequences_held(65, 129, 128) == 32 and sequences_held(1, 77, 128) == 0


def test_unset_budget_is_sized_on_cpu_only(tmp_path, caplog):
    path = checkpoint(tmp_path, **SMOLLM2)
    common = dict(model_path=path, dtype=torch.bfloat16, max_model_len=77, max_num_seqs=32)
    assert resolve_kv_cache_mb(64, **common, on_cpu=True) == 64  # explicit: as given
    assert resolve_kv_cache_mb(None, **common, on_cpu=False) is None  # GPU: vLLM's gpu_memory_utilization
    with caplog.at_level("INFO", logger="hybridrl.rollout.kv_budget"):
        assert resolve_kv_cache_mb(None, **common, on_cpu=True) == 93
        assert "93 MiB: 32 sequences (rollout.max_num_seqs) × 128 tokens (77 rounded up" in caplog.text
        assert resolve_kv_cache_mb(None, **{**common, "max_num_seqs": 10**6}, on_cpu=True) < 93 * 10**6 // 32
    assert "capped at a quarter of this machine's memory" in caplog.text


def test_block_size_is_32_on_cpu_unless_set_and_vllms_on_gpu():
    assert resolve_block_size(None, on_cpu=True) == CPU_KV_BLOCK_SIZE == 32
    assert resolve_block_size(None, on_cpu=False) is None
    assert resolve_block_size(128, on_cpu=True) == 128 and resolve_block_size(16, on_cpu=False) == 16


def test_unset_budget_counts_whole_blocks_of_the_engines_size(tmp_path, caplog):
    path = checkpoint(tmp_path, **SMOLLM2)
    with caplog.at_level("INFO", logger="hybridrl.rollout.kv_budget"):  # 77 tokens: three 32-token blocks each
        assert resolve_kv_cache_mb(None, model_path=path, dtype=torch.bfloat16, max_model_len=77, max_num_seqs=32,
                                   on_cpu=True, block_size=32) == kv_cache_mb_for(32, 77, 23040, block_size=32) == 69
    assert "× 96 tokens (77 rounded up to 32-token blocks)" in caplog.text


def test_unset_budget_for_a_model_without_head_counts_names_the_key(tmp_path):
    with pytest.raises(ValueError, match="rollout.kv_cache_memory_mb: cannot size vLLM's KV cache"):
        resolve_kv_cache_mb(None, model_path=str(tmp_path), dtype=torch.float32, max_model_len=64, max_num_seqs=8,
                            on_cpu=True)


def test_waves_warning_says_how_many_and_what_fits():
    cache = dict(budget_mb=64, num_blocks=22, block_size=128, max_model_len=77)
    assert waves_warning(21, 21, max_num_seqs=64, mb_needed=62, **cache) is None
    message = waves_warning(32, 21, max_num_seqs=64, mb_needed=93, **cache)
    assert "kv_cache_memory_mb=64: 22 blocks of 128 tokens" in message and "runs 21 sequences" in message
    assert "has 32: vLLM runs it in 2 waves" in message and ">= 93 to run 32 at once" in message
    # more rows than max_num_seqs: the budget that would help holds max_num_seqs, not every row
    assert ">= 90 to run 30 at once" in waves_warning(128, 21, max_num_seqs=30, mb_needed=90, **cache)


def test_no_waves_warning_when_the_scheduler_cap_splits_the_generation():
    """The demo's case: 128 rows, ``max_num_seqs`` 64 and a cache auto-sized for 64 (holding 73). vLLM runs 64 at a
    time because the user capped it there; a bigger cache would change nothing, so nothing is said."""
    assert waves_warning(128, 73, max_num_seqs=64, budget_mb=7, num_blocks=74, block_size=128, max_model_len=20,
                         mb_needed=13) is None
    assert CPU_BLOCK_SIZE == 128
