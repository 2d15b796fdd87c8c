"""The rollout-engine registry, the engines' declared capabilities and the vLLM engine's arguments, checked
without starting an engine."""

from __future__ import annotations

import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config.schema import RolloutConfig
from hybridrl.rollout import ROLLOUT_ENGINES, EngineInputs, build_rollout_engine, holds_own_weights
from hybridrl.rollout.hf import HFRollout
from hybridrl.rollout.vllm_engine import (VLLMRollout, _buckets, _check_engine_inputs, _engine_kwargs,
                                          _parallel_kwargs, import_vllm)
from hybridrl.utils.registry import UnknownNameError
from hybridrl.utils.tiny_model import save_tiny_model


def test_registry_names_and_unknown_name():
    assert ROLLOUT_ENGINES.names()[:2] == ("hf", "vllm")
    with pytest.raises(UnknownNameError, match="valid names: hf, vllm"):
        build_rollout_engine("sglang", EngineInputs(rollout=RolloutConfig(), pad_token_id=0, eos_token_ids=[1]))


def test_hf_engine_from_registry(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = build_rollout_engine("hf", EngineInputs(rollout=RolloutConfig(), pad_token_id=tokenizer.pad_token_id,
                                                     eos_token_ids=[tokenizer.eos_token_id], model=model))
    assert isinstance(engine, HFRollout) and engine.model is model


def test_engines_name_what_they_miss():
    inputs = EngineInputs(rollout=RolloutConfig(name="vllm"), pad_token_id=0, eos_token_ids=[1])
    with pytest.raises(ValueError, match="EngineInputs.model is required"):
        build_rollout_engine("hf", inputs)
    with pytest.raises(ValueError, match="model_path"):
        build_rollout_engine("vllm", inputs)


def test_engines_declare_whether_they_hold_their_own_weights():
    assert ROLLOUT_ENGINES["hf"] is HFRollout and ROLLOUT_ENGINES["vllm"] is VLLMRollout
    assert not holds_own_weights("hf") and holds_own_weights("vllm")


def test_a_registration_without_the_capabilities_is_refused_where_it_happens():
    with pytest.raises(TypeError, match="rollout engine 'builder_fn'.*lacks generates_with_actor_module, from_inputs"):
        ROLLOUT_ENGINES.register("builder_fn")(lambda inputs: None)
    assert "builder_fn" not in ROLLOUT_ENGINES


def test_engine_kwargs_from_config():
    rollout = RolloutConfig(name="vllm", max_num_seqs=8, max_num_batched_tokens=512)
    kwargs = _engine_kwargs(rollout, "float32", 96, default_seed=7, on_cpu=True, kv_cache_mb=32)
    assert (kwargs["kv_cache_memory_bytes"], kwargs["max_num_seqs"], kwargs["max_num_batched_tokens"]) == (
        32 << 20, 8, 512)
    assert kwargs["seed"] == 7 and kwargs["max_model_len"] == 96 and kwargs["dtype"] == "float32"
    assert _engine_kwargs(RolloutConfig(seed=3), "float32", 96, default_seed=7, on_cpu=True,
                          kv_cache_mb=32)["seed"] == 3


@pytest.mark.parametrize("change, dtype, max_model_len, message", [
    ({}, "float16", 64, "not supported on CPU"),
    ({}, "bfloat16", 0, "max_model_len=0"),
])
def test_cpu_settings_refused_with_the_key(change, dtype, max_model_len, message):
    rollout = RolloutConfig(name="vllm", **change)
    with pytest.raises(ValueError, match=message):
        _check_engine_inputs(rollout, dtype, max_model_len, on_cpu=True)


def test_tensor_parallel_engine_needs_the_worker_groups_process_group():
    """Outside a worker group (no ``torch.distributed`` world here) ``t_g > 1`` is refused naming the key; with
    ``t_g = 1`` nothing parallel is asked of vLLM."""
    with pytest.raises(ValueError, match="rollout.tensor_model_parallel_size=2 needs a process group"):
        _parallel_kwargs(2, on_cpu=True)
    assert _parallel_kwargs(1, on_cpu=True) == {}


def test_gpu_settings_allowed_and_sleep_mode():
    rollout = RolloutConfig(name="vllm", tensor_model_parallel_size=2, gpu_memory_utilization=0.4)
    _check_engine_inputs(rollout, "float16", 64, on_cpu=False)
    kwargs = _engine_kwargs(rollout, "float16", 64, default_seed=0, on_cpu=False)
    assert kwargs["enable_sleep_mode"] and kwargs["gpu_memory_utilization"] == 0.4
    assert "kv_cache_memory_bytes" not in kwargs and kwargs["tensor_parallel_size"] == 2


def test_cpu_engine_kwargs_use_the_kv_budget_and_block_size():
    kwargs = _engine_kwargs(RolloutConfig(), "bfloat16", 64, default_seed=0, on_cpu=True, kv_cache_mb=64, block_size=32)
    assert kwargs["kv_cache_memory_bytes"] == 64 << 20 and "enable_sleep_mode" not in kwargs
    assert kwargs["max_model_len"] == 64 and kwargs["enable_prefix_caching"] and kwargs["block_size"] == 32
    assert "block_size" not in _engine_kwargs(RolloutConfig(), "bfloat16", 64, default_seed=0, on_cpu=False)


def test_buckets_bound_their_size():
    tensors = [(f"w{i}", torch.zeros(size, dtype=torch.float32)) for i, size in enumerate([10, 10, 30, 5, 1])]
    buckets = list(_buckets(iter(tensors), max_bytes=80))  # 80 bytes = 20 floats
    assert [[name for name, _ in bucket] for bucket in buckets] == [["w0", "w1"], ["w2"], ["w3", "w4"]]


def test_missing_vllm_says_how_to_install(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # import_vllm sets both; monkeypatch restores them
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(ImportError, match=r"hybridrl\[cpu\]"):
        import_vllm()
