"""``VLLMRollout`` on a CUDA device: sleep/wake frees and restores memory, and the GPU weight-sync path
(``model.load_weights`` in bounded buckets) makes rollout log-probs follow the trainer's weights.

Skipped without a GPU (``tests/conftest.py``) or without vLLM. Not yet run: the GPU machines seen (H200, 2026-11-30
and 2026-12-04) had no vLLM, and its wheel is too large to carry there.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.config.schema import RolloutConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.vllm_engine import VLLMRollout
from hybridrl.utils.tiny_model import encode_chat, save_tiny_model
from hybridrl.modeling.sequences import response_log_probs

pytestmark = pytest.mark.gpu

PROMPTS = ["12+34=", "what is 7*8?", "hello there", "x"]
MAX_NEW_TOKENS = 16
LOG_PROB_TOLERANCE = 2e-3  # fp32 on different GPU kernels (vLLM attention vs sdpa); a wrong sync is off by ≫ 0.1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("vllm_gpu") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tokenizer):
    pytest.importorskip("vllm", reason="needs vLLM (pip install 'hybridrl[vllm]')")
    rollout = RolloutConfig(name="vllm", kv_cache_memory_mb=1024, free_cache_engine=True,
                            weight_sync_bucket_mb=1)  # 1 MiB buckets: the tiny model takes several RPCs
    engine = VLLMRollout(str(model_dir), pad_token_id=tokenizer.pad_token_id,
                         eos_token_ids=[tokenizer.eos_token_id], rollout=rollout, max_model_len=128,
                         dtype="float32", seed=0)
    yield engine
    engine.close()


def prompt_batch(tokenizer) -> Batch:
    encoded = tokenizer.pad({"input_ids": encode_chat(tokenizer, PROMPTS)}, return_tensors="pt")
    return Batch(tensors={Fields.INPUT_IDS: encoded["input_ids"], Fields.ATTENTION_MASK: encoded["attention_mask"]})


@torch.no_grad()
def log_prob_gap(engine, tokenizer, model) -> float:
    rollout = engine.generate(prompt_batch(tokenizer),
                              SamplingParams(n=2, max_new_tokens=MAX_NEW_TOKENS, temperature=0.7, seed=3))
    trainer, _ = response_log_probs(model, rollout[Fields.INPUT_IDS].cuda(), rollout[Fields.ATTENTION_MASK].cuda(),
                                    MAX_NEW_TOKENS, temperature=0.7)
    mask = rollout[Fields.RESPONSE_MASK].bool().cuda()
    return float((trainer - rollout[Fields.ROLLOUT_LOG_PROBS].cuda()).abs()[mask].max())


def test_sleep_frees_memory_and_wake_restores_outputs(engine, tokenizer):
    params = SamplingParams(max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    before = engine.generate(prompt_batch(tokenizer), params)[Fields.RESPONSES]
    free_awake, _ = torch.cuda.mem_get_info()
    engine.release_memory()
    free_asleep, _ = torch.cuda.mem_get_info()
    assert free_asleep - free_awake > 512 << 20  # most of the 1 GiB KV cache is back
    with pytest.raises(RuntimeError, match="sleeps"):
        engine.update_weights([])
    engine.resume()
    assert torch.equal(engine.generate(prompt_batch(tokenizer), params)[Fields.RESPONSES], before)


def test_gpu_weight_sync_follows_the_trainer(engine, tokenizer, model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    assert log_prob_gap(engine, tokenizer, model) < LOG_PROB_TOLERANCE
    updated = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in updated.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    stats = engine.update_weights(updated.named_parameters())
    assert stats.num_tensors == len(list(updated.parameters()))
    assert log_prob_gap(engine, tokenizer, updated) < LOG_PROB_TOLERANCE
    assert log_prob_gap(engine, tokenizer, model) > 10 * LOG_PROB_TOLERANCE  # it really changed
    engine.update_weights(model.named_parameters())
    assert log_prob_gap(engine, tokenizer, model) < LOG_PROB_TOLERANCE
