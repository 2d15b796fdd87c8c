"""The LM head on the scored positions only (``hybridrl.modeling.scored_head``): the selected path (the default) and
the fused one (``model.use_fused_kernels``) give the reference path's numbers — the head on every position
``logits_to_keep`` names, then the selection — log-probs, entropies and every parameter's gradient, in each layout
(padded, packed, shared prompts), with tied and untied heads, at a temperature, in fp32 and under one-rank bf16 mixed
precision; the fused path keeps no ``[tokens, vocab]`` tensor for backward; models that may transform their head's
output keep the reference path."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.scored_head import fused_output_head, runs_head_on_scored_positions
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


PATHS = {"reference": dict(head_on_scored=False), "selected": dict(head_on_scored=True),
         "fused": dict(fused_head=True)}


def outputs_and_grads(model, path, layout, temperature=1.0):
    model.zero_grad()
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE, with_entropy=True,
                                            entropy_grad=True, temperature=temperature, **PATHS[path],
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


@pytest.mark.parametrize("path", ["selected", "fused"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2_tied"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_scored_head_equals_the_reference_fp32(model_dirs, path, architecture, layout, temperature):
    model = build_model(ModelConfig(path=model_dirs[architecture], dtype="float32"), "actor")
    reference = outputs_and_grads(model, "reference", layout, temperature)
    scored = outputs_and_grads(model, path, layout, temperature)
    assert scored[0].abs().sum() > 0 and scored[1].abs().sum() > 0
    assert_same(scored, reference, atol=1e-5)
    if path == "selected":  # the same head matmul on the same rows, the same log-softmax: the same bits
        assert torch.equal(scored[0], reference[0]) and torch.equal(scored[1], reference[1])


@pytest.mark.parametrize("path", ["selected", "fused"])
@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
def test_scored_head_equals_the_reference_under_one_rank_bf16_casts(model_dirs, path, layout):
    """bf16 compute, fp32 master weights (the one-rank path of ``model.dtype=bfloat16``): the forward is the same
    bf16 matmul cast to fp32, so log-probs agree to fp32 rounding (the selected path: the same bits); gradients to
    bf16 rounding."""
    model = build_model(ModelConfig(path=model_dirs["qwen2_tied"], dtype="float32"), "actor")
    apply_compute_dtype(model, torch.bfloat16)
    with casts_kept(model):
        reference = outputs_and_grads(model, "reference", layout)
    with casts_kept(model):
        scored = outputs_and_grads(model, path, layout)
    torch.testing.assert_close(scored[0], reference[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(scored[1], reference[1], atol=1e-4, rtol=0)
    if path == "selected":
        assert torch.equal(scored[0], reference[0])
    for name in reference[2]:
        assert scored[2][name].dtype == torch.float32
        torch.testing.assert_close(scored[2][name], reference[2][name], atol=2e-2, rtol=2e-2, msg=name)


def forward_flops(model, layout, **path):
    """Matmul FLOPs of one no-grad ``response_log_probs`` on the uneven batch."""
    from torch.utils.flop_counter import FlopCounterMode

    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        response_log_probs(model, input_ids, attention_mask, RESPONSE, **LAYOUTS[layout], **path)
    return counter.get_total_flops()


@pytest.mark.parametrize("layout", ["padded", "shared"])
def test_the_selected_path_is_the_default_and_runs_the_head_on_the_scored_rows_only(model_dirs, layout):
    """By default the head's matmul covers the ``M`` scored positions: ``2·D·V`` FLOPs fewer per position the
    reference path runs its head on (rows of uneven length) and scores nothing with."""
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    assert runs_head_on_scored_positions(model)
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    head_rows = []
    handle = fused_output_head(model).register_forward_hook(
        lambda module, args, output: head_rows.append(args[0].shape[:-1].numel()))

    try:
        default, reference = forward_flops(model, layout), forward_flops(model, layout, head_on_scored=False)
    finally:
        handle.remove()
    scored = int(attention_mask[:, -RESPONSE:].sum())
    assert head_rows[0] == head_rows[1] > scored  # the positions logits_to_keep names
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    assert reference - default == 2 * hidden * vocab * (head_rows[1] - scored)


@pytest.mark.parametrize("model_type", ["gemma2", "granite", "cohere"])
def test_model_types_that_may_transform_the_head_output_keep_the_reference_path(model_dirs, model_type):
    """A model type outside the checked list (these soft-cap or rescale their logits after the head) keeps the
    reference path by default, and the fused path is refused, naming the key."""
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    model.config.model_type = model_type
    assert not runs_head_on_scored_positions(model)
    reference = forward_flops(model, "padded", head_on_scored=False)
    assert forward_flops(model, "padded") == reference > forward_flops(model, "padded", head_on_scored=True)
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(ValueError, match="model.use_fused_kernels=false"):
        response_log_probs(model, input_ids, attention_mask, RESPONSE, fused_head=True)


def test_no_vocab_sized_tensor_is_saved_for_backward(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    vocab = fused_output_head(model).weight.shape[0]
    input_ids, attention_mask = grouped_batch(**UNEVEN)

    def saved_shapes(path):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            response_log_probs(model, input_ids, attention_mask, RESPONSE, with_entropy=True, **PATHS[path])
        return shapes

    def vocab_sized(shapes):
        return [s for s in shapes if len(s) >= 2 and s[-1] == vocab and s != tuple(fused_output_head(model).weight.shape)]

    assert vocab_sized(saved_shapes("reference"))  # the plain paths keep [tokens, vocab] logits
    assert vocab_sized(saved_shapes("selected"))
    assert not vocab_sized(saved_shapes("fused"))


def test_head_forward_is_restored_after_an_error(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(IndexError):
        _fail_inside_forward(model, input_ids, attention_mask)
    assert "forward" not in fused_output_head(model).__dict__
    log_probs, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)
    assert torch.isfinite(log_probs).all()


def _fail_inside_forward(model, input_ids, attention_mask):
    from hybridrl.modeling.scored_head import scored_head_log_probs
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    scored_head_log_probs(model, inputs, lambda hidden: hidden[:, 10_000], torch.zeros(1, dtype=torch.long),
                          temperature=1.0, with_entropy=False, entropy_grad=False, fused=True)


def test_a_head_with_bias_is_refused_naming_the_key(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    head = fused_output_head(model)
    model.set_output_embeddings(torch.nn.Linear(head.in_features, head.out_features, bias=True))
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(ValueError, match="model.use_fused_kernels=false"):
        response_log_probs(model, input_ids, attention_mask, RESPONSE, fused_head=True)


def test_asking_for_the_selected_path_without_a_bias_free_head_is_a_clear_error(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    head = fused_output_head(model)
    model.set_output_embeddings(torch.nn.Linear(head.in_features, head.out_features, bias=True))
    assert not runs_head_on_scored_positions(model)
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with pytest.raises(ValueError, match="needs a bias-free nn.Linear head"):
        response_log_probs(model, input_ids, attention_mask, RESPONSE, head_on_scored=True)
    log_probs, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)  # the default: the reference path
    assert torch.isfinite(log_probs).all()
