"""``model.attn_implementation=auto``: the CPU kernel computes the same attention as sdpa, in every way a model is run
(padded, packed, cached decoding, backward), and hands long sequences to sdpa."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from hybridrl.config.schema import ModelConfig
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.modeling import attention
from hybridrl.modeling.attention import CPU_ATTENTION, EAGER_MAX_SCORES, attention_implementation, direct_attention
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import response_log_probs


def qkv(batch=3, heads=4, kv_heads=2, q_len=7, k_len=7, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(batch, heads, q_len, dim), (batch, kv_heads, k_len, dim), (batch, kv_heads, k_len, dim)]
    return [torch.randn(*shape, generator=generator, requires_grad=True) for shape in shapes]


def sdpa_reference(query, key, value, mask, is_causal=False):
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=is_causal).transpose(1, 2)


@pytest.mark.parametrize("case", ["causal", "bool_mask", "float_mask", "decode", "cached_prefix"])
def test_direct_attention_equals_sdpa_values_and_gradients(case):
    q_len, k_len = {"decode": (1, 9), "cached_prefix": (4, 9)}.get(case, (7, 7))
    query, key, value = qkv(q_len=q_len, k_len=k_len)
    causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    bool_mask = causal.expand(3, 1, q_len, k_len).clone()
    bool_mask[0, :, :, :2] = False  # left padding of two tokens in row 0 ...
    bool_mask[0, :, -q_len:, :][..., torch.arange(q_len), torch.arange(k_len - q_len, k_len)] = True  # ... its diagonal
    mask = {"causal": None, "bool_mask": bool_mask, "decode": None, "cached_prefix": None,
            "float_mask": torch.zeros(3, 1, q_len, k_len).masked_fill(~bool_mask, float("-inf"))}[case]
    reference_mask = causal if mask is None else mask
    expected = sdpa_reference(query, key, value, reference_mask)
    actual = direct_attention(query, key, value, mask)
    assert actual.shape == (3, q_len, 4, 16)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (query, key, value))
    actual_grads = torch.autograd.grad((actual * weights).sum(), (query, key, value))
    for got, want in zip(actual_grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layout", ["per_head", "heads_only", "two_d"])
def test_direct_attention_masks_of_every_broadcast_layout_equal_sdpa(layout):
    """The query heads are folded into their KV head's rows, so the mask must follow them: a per-head mask
    ``[B, H, q, k]`` (each query head its own pattern), ``[H, q, k]`` and ``[q, k]``."""
    query, key, value = qkv(q_len=5, k_len=5)
    generator = torch.Generator().manual_seed(3)
    full = torch.rand(3, 4, 5, 5, generator=generator) > 0.3
    full |= torch.eye(5, dtype=torch.bool)  # every query sees at least itself
    mask = {"per_head": full, "heads_only": full[0], "two_d": full[0, 0]}[layout]
    expected = sdpa_reference(query, key, value, mask)
    actual = direct_attention(query, key, value, mask)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    weights = torch.randn(expected.shape, generator=generator)
    for got, want in zip(torch.autograd.grad((actual * weights).sum(), (query, key, value)),
                         torch.autograd.grad((expected * weights).sum(), (query, key, value))):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def masked_by_where_reference(query, key, value, mask):
    """The kernel's previous masking, kept as the reference of its one-pass form: cast the scores to fp32, scale,
    ``where`` the masked ones to fp32's minimum; KV heads repeated per query head."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = torch.matmul(query, key.transpose(-1, -2)).float() * query.shape[-1] ** -0.5
    scores = torch.where(mask, scores, torch.finfo(torch.float32).min)
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    return torch.matmul(weights, value).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_one_pass_scale_and_mask_is_the_where_bit_for_bit(dtype):
    """Values and query gradients the same bits as scale-then-``where`` (bf16 is what the actor runs on CPU), with
    left padding; a pad query with no visible key gets uniform weights in both. Such a query's output feeds nothing in
    a model, so no gradient reaches it; if one did, it would now flow into its scores as through eager attention's
    additive mask (``where`` stopped it). (Key and value gradients are summed over a KV head's query heads in another
    order, see ``direct_attention``; they match within rounding.)"""
    query, key, value = (tensor.detach().to(dtype).requires_grad_() for tensor in qkv(q_len=6, k_len=6, dim=64))
    mask = torch.ones(3, 1, 6, 6, dtype=torch.bool).tril()
    mask[0, :, 1:, :2] = False  # row 0: two pad tokens, the first sees itself, the second nothing
    mask[1, :, 0, :] = False  # row 1's first query sees nothing
    actual, expected = direct_attention(query, key, value, mask), masked_by_where_reference(query, key, value, mask)
    assert torch.equal(actual, expected)
    upstream = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    upstream[~mask.any(-1).squeeze(1)] = 0  # [B, q] queries that see no key: their outputs feed nothing
    (actual_q,) = torch.autograd.grad((actual * upstream).sum(), (query,))
    (expected_q,) = torch.autograd.grad((expected * upstream).sum(), (query,))
    assert torch.equal(actual_q, expected_q)


def test_a_query_row_with_no_visible_key_gets_finite_output():
    query, key, value = qkv(q_len=3, k_len=3)
    mask = torch.ones(3, 1, 3, 3, dtype=torch.bool).tril()
    mask[1, :, 0, :] = False  # a pad query that sees nothing (left padding)
    assert torch.isfinite(direct_attention(query, key, value, mask)).all()


def test_auto_resolves_per_device():
    assert attention_implementation("auto", "cpu") == CPU_ATTENTION
    assert attention_implementation("auto", "cuda", torch.float32) == "sdpa"  # flash-attn needs bf16/fp16
    assert attention_implementation("flash_attention_2", "cpu") == "sdpa"
    assert attention_implementation("sdpa", "cpu") == "sdpa"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    path = str(save_tiny_model(tmp_path_factory.mktemp("model"), TinyModelSpec(num_heads=4, num_kv_heads=2,
                                                                                hidden_size=64)))
    auto = build_model(ModelConfig(path=path, dtype="float32", attn_implementation="auto"), "actor")
    sdpa = build_model(ModelConfig(path=path, dtype="float32", attn_implementation="sdpa"), "actor")
    assert auto.config._attn_implementation == CPU_ATTENTION and sdpa.config._attn_implementation == "sdpa"
    return auto, sdpa, path


def padded_batch(rows=4, prompt=6, response=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, 60, (rows, prompt + response), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding
    attention_mask[2, -2:] = 0  # a short response
    return input_ids * attention_mask, attention_mask, response


@pytest.mark.parametrize("packed", [False, True])
def test_model_log_probs_and_gradients_equal_sdpa(tiny_models, packed):
    auto, sdpa, _ = tiny_models
    input_ids, attention_mask, response = padded_batch()
    results = []
    for model in (auto, sdpa):
        model.zero_grad()
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, response, packed=packed)
        (log_probs * attention_mask[:, -response:]).sum().backward()
        results.append((log_probs.detach(), [parameter.grad.clone() for parameter in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for got, want in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_cached_generation_equals_sdpa(tiny_models):
    auto, sdpa, _ = tiny_models
    input_ids, attention_mask, _ = padded_batch()
    outputs = []
    for model in (auto, sdpa):
        model.eval()
        with torch.no_grad():
            outputs.append(model.generate(input_ids=input_ids[:, :6], attention_mask=attention_mask[:, :6],
                                          max_new_tokens=8, do_sample=False, use_cache=True, pad_token_id=0,
                                          output_scores=True, return_dict_in_generate=True))
        model.train()
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    for got, want in zip(outputs[0].scores, outputs[1].scores):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_long_sequences_go_to_sdpa_and_short_ones_do_not(tiny_models, monkeypatch):
    auto, _, _ = tiny_models
    calls = []
    computed_here = attention.direct_attention

    def counting(query, *args, **kwargs):
        calls.append(query.shape[2])
        return computed_here(query, *args, **kwargs)

    monkeypatch.setattr(attention, "direct_attention", counting)
    side = int(EAGER_MAX_SCORES ** 0.5)
    with torch.no_grad():
        auto(input_ids=torch.randint(4, 60, (1, side)), use_cache=False)
        assert calls == [side] * auto.config.num_hidden_layers
        auto(input_ids=torch.randint(4, 60, (1, side + 1)), use_cache=False)
    assert calls == [side] * auto.config.num_hidden_layers  # no new direct calls: sdpa took the longer one


def test_a_saved_checkpoint_does_not_name_the_cpu_kernel(tiny_models, tmp_path):
    auto, _, _ = tiny_models
    auto.save_pretrained(tmp_path / "saved")
    assert CPU_ATTENTION not in json.dumps(json.loads((tmp_path / "saved" / "config.json").read_text()))
