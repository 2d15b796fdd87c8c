"""The fast decode step (``hybridrl.modeling.decode_step``) against the module's own forward, bit for bit, on every
model type it covers; what it refuses; and the HF engine with it on and off giving the same rollouts."""

from __future__ import annotations

import logging

import pytest
import torch
from decode_parity import decode_both_ways
from transformers import AutoModelForCausalLM, GemmaConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from hybridrl.modeling.attention import attention_implementation
from hybridrl.modeling.decode_step import DecodeStep, fast_decode_unsupported
from hybridrl.modeling.prepacked import linears_prepacked, prepacking_available
from hybridrl.modeling.single_rank import apply_compute_dtype, casts_kept, compute_parameters_in_place
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=1)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SIZES),
    "llama_biased_tied": lambda: LlamaConfig(**SIZES, attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "mistral": lambda: MistralConfig(**SIZES, sliding_window=None),
    "qwen2": lambda: Qwen2Config(**SIZES),
    "qwen3": lambda: Qwen3Config(**SIZES, head_dim=32),
}
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="bf16 on CPU needs oneDNN"))]


def tiny(kind: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[kind](), dtype=torch.float32,
                                             attn_implementation=attention_implementation("auto", "cpu")).eval()
    for name, param in model.named_parameters():  # random biases and norm weights: zeros and ones hide mistakes
        if name.endswith("bias") or "norm" in name:
            torch.nn.init.normal_(param, mean=1.0 if "norm" in name else 0.0, std=0.2)
    return model.to(dtype)


def left_padded_prompts(rows: int = 5, length: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 97, (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : row % 4] = 0   # rows with 0–3 pads on the left
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_same_logits_as_the_module_every_step(kind, dtype):
    model = tiny(kind, dtype)
    assert fast_decode_unsupported(model) is None
    ids, mask = left_padded_prompts()
    with linears_prepacked(model):
        pairs, cache, reference_cache = decode_both_ways(model, ids, mask, steps=5)
    for got, expected in pairs:
        assert got.dtype == dtype and got.shape == expected.shape
        assert torch.equal(got, expected), (got - expected).abs().max()
    assert all(torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
               for mine, theirs in zip(cache, reference_cache))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_products_are_packed_where_onednn_has_the_dtype(dtype):
    """bf16 where the CPU has native bf16, fp32 wherever oneDNN runs: then one packed product for q, k and v and one
    for gate and up; unpacked, one product per projection (a concatenation would be a second copy of the weights)."""
    layer = DecodeStep(tiny("llama", dtype)).layers[0]
    assert len(layer.qkv) == (1 if prepacking_available(dtype) else 3)
    assert len(layer.gate_up) == (1 if prepacking_available(dtype) else 2)
    assert all(product.packed == prepacking_available(dtype) for product in (*layer.qkv, layer.o, layer.down))


def test_what_it_refuses():
    gemma = AutoModelForCausalLM.from_config(GemmaConfig(**SIZES, head_dim=16))
    assert "model type 'gemma'" in fast_decode_unsupported(gemma)
    assert "sliding-window" in fast_decode_unsupported(
        AutoModelForCausalLM.from_config(MistralConfig(**SIZES, sliding_window=8)))
    qwen2 = tiny("qwen2")
    assert fast_decode_unsupported(qwen2) is None

    class Adapted(torch.nn.Linear):
        pass

    qwen2.model.layers[1].self_attn.v_proj = Adapted(64, 32)
    assert "layer 1" in fast_decode_unsupported(qwen2) and "nn.Linear" in fast_decode_unsupported(qwen2)
    with pytest.raises(ValueError, match="cannot run this model: layer 1"):
        DecodeStep(qwen2)


def engine_rollouts(model, fast: bool, params: SamplingParams, micro_batch_size=None):
    ids, mask = left_padded_prompts(rows=4)
    prompts = Batch(tensors={Fields.INPUT_IDS: ids, Fields.ATTENTION_MASK: mask},
                    non_tensors={Fields.UID: [f"p{i}" for i in range(4)]})
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=[1], fast_decode=fast, micro_batch_size=micro_batch_size)
    return engine.generate(prompts, params), engine


@pytest.mark.parametrize("n, micro_batch_size", [(1, None), (3, 6)])
def test_engine_samples_the_same_rollouts_either_way_in_mixed_precision(n, micro_batch_size, caplog):
    """bf16 compute over fp32 master weights (one rank, ``single_rank`` casts), left padding, shared prefill (n = 3)
    and several chunks: the fast step gives the module's responses and log-probs exactly."""
    model = apply_compute_dtype(tiny("qwen2"), torch.bfloat16)
    params = SamplingParams(n=n, max_new_tokens=6, temperature=0.8, seed=3)
    with caplog.at_level(logging.INFO, logger="hybridrl.rollout.hf"):
        fast, fast_engine = engine_rollouts(model, True, params, micro_batch_size)
    plain, plain_engine = engine_rollouts(model, False, params, micro_batch_size)
    assert (fast_engine.decode_path, plain_engine.decode_path) == ("fast", "module")
    assert plain_engine.fast_decode_unsupported == "rollout.hf_fast_decode=false"
    assert "decode steps run on the weights directly" in caplog.text
    assert torch.equal(fast[Fields.RESPONSES], plain[Fields.RESPONSES])
    assert torch.equal(fast[Fields.ROLLOUT_LOG_PROBS], plain[Fields.ROLLOUT_LOG_PROBS])
    assert all(param.dtype == torch.float32 for param in model.parameters())   # master weights back in place


def test_unsupported_models_run_the_module_and_say_why(caplog):
    model = tiny("llama")
    model.config.model_type = "llama_variant"   # as a remote-code model would report itself
    params = SamplingParams(n=2, max_new_tokens=4, do_sample=False)
    with caplog.at_level(logging.INFO, logger="hybridrl.rollout.hf"):
        out, engine = engine_rollouts(model, True, params)
    assert engine.decode_path == "module" and "model type 'llama_variant'" in caplog.text
    model.config.model_type = "llama"
    again, _ = engine_rollouts(model, True, params)
    assert torch.equal(out[Fields.RESPONSES], again[Fields.RESPONSES])


def test_compute_parameters_in_place_swaps_the_casts_in_and_back():
    model = apply_compute_dtype(tiny("llama"), torch.bfloat16)
    with casts_kept(model):
        with compute_parameters_in_place(model):
            inside = model.model.layers[0].mlp.down_proj.weight
        with compute_parameters_in_place(model):   # the same kept cast, not a second one
            assert model.model.layers[0].mlp.down_proj.weight is inside
    assert inside.dtype == torch.bfloat16 and model.model.layers[0].mlp.down_proj.weight.dtype == torch.float32


def test_a_step_that_cannot_be_built_falls_back_to_the_module(monkeypatch, caplog):
    """If building the step fails at run time (e.g. FSDP2 shards that were not gathered), generation goes on through
    the module's forward, with the same tokens, and the log names the failure."""
    import hybridrl.rollout.hf_decode as hf_decode

    def refuse(model, prepack=True):
        raise ValueError("the fast decode step needs gathered parameters (simulated)")

    model = tiny("llama")
    params = SamplingParams(n=2, max_new_tokens=4, do_sample=False)
    expected, _ = engine_rollouts(model, True, params)
    monkeypatch.setattr(hf_decode, "DecodeStep", refuse)
    with caplog.at_level(logging.INFO, logger="hybridrl.rollout.hf"):
        out, engine = engine_rollouts(model, True, params)
    assert engine.decode_path == "module" and "could not be built" in caplog.text and "(simulated)" in caplog.text
    assert torch.equal(out[Fields.RESPONSES], expected[Fields.RESPONSES])
