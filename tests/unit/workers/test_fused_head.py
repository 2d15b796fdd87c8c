"""``model.use_fused_kernels``: the actor's log-probs with the LM head fused into the log-softmax equal the plain
path's — log-probs, entropies and every parameter's gradient — in each layout (padded, packed, shared prompts), with
tied and untied heads, at a temperature, in fp32 and under one-rank bf16 mixed precision; and no ``[tokens, vocab]``
tensor is kept for backward."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.fused_head import output_head
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.modeling.single_rank import casts_kept, apply_compute_dtype
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model

from test_shared_prompts import RESPONSE, UNEVEN, grouped_batch

LAYOUTS = {"padded": dict(packed=False, share_prompts=False), "packed": dict(packed=True),
           "shared": dict(packed=False, share_prompts=True)}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fused")
    return {"llama": str(save_tiny_model(root / "llama", TinyModelSpec(num_heads=4, num_kv_heads=2))),
            "qwen2_tied": str(save_tiny_model(root / "qwen2", TinyModelSpec(architecture="qwen2", num_heads=4,
                                                                            num_kv_heads=2, tie_word_embeddings=True)))}


def outputs_and_grads(model, fused, layout, temperature=1.0):
    model.zero_grad()
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE, with_entropy=True,
                                            entropy_grad=True, temperature=temperature, fused_head=fused,
                                            **LAYOUTS[layout])
    weights = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    ((log_probs * weights).sum() + 0.3 * entropy.sum()).backward()
    return log_probs.detach(), entropy.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same(fused, plain, atol):
    torch.testing.assert_close(fused[0], plain[0], atol=atol, rtol=0)
    torch.testing.assert_close(fused[1], plain[1], atol=atol, rtol=0)
    assert fused[2].keys() == plain[2].keys()
    for name in plain[2]:
        torch.testing.assert_close(fused[2][name], plain[2][name], atol=atol, rtol=atol, msg=name)


@pytest.mark.parametrize("architecture", ["llama", "qwen2_tied"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_fused_equals_plain_fp32(model_dirs, architecture, layout, temperature):
    model = build_model(ModelConfig(path=model_dirs[architecture], dtype="float32"), "actor")
    plain = outputs_and_grads(model, False, layout, temperature)
    fused = outputs_and_grads(model, True, layout, temperature)
    assert fused[0].abs().sum() > 0 and fused[1].abs().sum() > 0
    assert_same(fused, plain, atol=1e-5)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_fused_equals_plain_under_one_rank_bf16_casts(model_dirs, layout):
    """bf16 compute, fp32 master weights (the one-rank path of ``model.dtype=bfloat16``): the forward is the same
    bf16 matmul cast to fp32, so log-probs agree to fp32 rounding; gradients to bf16 rounding."""
    model = build_model(ModelConfig(path=model_dirs["qwen2_tied"], dtype="float32"), "actor")
    apply_compute_dtype(model, torch.bfloat16)
    with casts_kept(model):
        plain = outputs_and_grads(model, False, layout)
    with casts_kept(model):
        fused = outputs_and_grads(model, True, layout)
    torch.testing.assert_close(fused[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(fused[1], plain[1], atol=1e-4, rtol=0)
    for name in plain[2]:
        assert fused[2][name].dtype == torch.float32
        torch.testing.assert_close(fused[2][name], plain[2][name], atol=2e-2, rtol=2e-2, msg=name)


def test_no_vocab_sized_tensor_is_saved_for_backward(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    vocab = output_head(model).weight.shape[0]
    input_ids, attention_mask = grouped_batch(**UNEVEN)

    def saved_shapes(fused):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            response_log_probs(model, input_ids, attention_mask, RESPONSE, fused_head=fused, with_entropy=True)
        return shapes

    def vocab_sized(shapes):
        return [s for s in shapes if len(s) >= 2 and s[-1] == vocab and s != tuple(output_head(model).weight.shape)]

    assert vocab_sized(saved_shapes(False))  # the plain path keeps [tokens, vocab] logits
    assert not vocab_sized(saved_shapes(True))


def test_head_forward_is_restored_after_an_error(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(IndexError):
        _fail_inside_forward(model, input_ids, attention_mask)
    assert "forward" not in output_head(model).__dict__
    log_probs, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)
    assert torch.isfinite(log_probs).all()


def _fail_inside_forward(model, input_ids, attention_mask):
    from hybridrl.modeling.fused_head import fused_head_log_probs
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    fused_head_log_probs(model, inputs, lambda hidden: hidden[:, 10_000], torch.zeros(1, dtype=torch.long),
                         temperature=1.0, with_entropy=False, entropy_grad=False)


def test_a_head_with_bias_is_refused_naming_the_key(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    head = output_head(model)
    model.set_output_embeddings(torch.nn.Linear(head.in_features, head.out_features, bias=True))
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(ValueError, match="model.use_fused_kernels=false"):
        response_log_probs(model, input_ids, attention_mask, RESPONSE, fused_head=True)
