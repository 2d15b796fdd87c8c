"""Generation's linears against oneDNN-prepacked weights (``hybridrl.modeling.prepacked``): in bf16 the same bits as
``F.linear``, in fp32 within fp32 rounding of MKL's products; each weight packed once per context, nothing packed with
grad on or when weights change per call; the HF engine samples the same rollouts with packing on and off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import profile

import hybridrl.modeling.decode_step as decode_step
import hybridrl.modeling.prepacked as prepacked
from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.single_rank import apply_compute_dtype, casts_kept
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import save_tiny_model

DTYPES = [pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
              not prepacked.prepacking_available(torch.bfloat16),
              reason="this CPU / torch build has no oneDNN bf16 prepacked linear (no native bf16)")),
          pytest.param(torch.float32, marks=pytest.mark.skipif(
              not prepacked.prepacking_available(torch.float32),
              reason="fp32 is not in prepacked.PACKED_DTYPES (off by default), or this torch build has no oneDNN"))]
FP32_ROUNDING = dict(rtol=1e-5, atol=1e-5)
"""oneDNN's fp32 products against MKL's: the same sums in another order (measured ≤ 6e-6 on SmolLM2's head)."""


@pytest.fixture(scope="module")
def directory(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("prepacked") / "model")


@pytest.fixture(params=DTYPES, ids=["bf16", "fp32"])
def dtype(request):
    return request.param


@pytest.fixture
def model(dtype, directory):
    """fp32 master weights computing in ``dtype`` on one rank, as the actor on a CPU runs."""
    model = build_model(ModelConfig(path=str(directory), dtype="float32"), "actor")
    return apply_compute_dtype(model, dtype)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """bf16: the same bits; fp32: within fp32 rounding."""
    return torch.equal(a, b) if a.dtype == torch.bfloat16 else torch.allclose(a, b, **FP32_ROUNDING)


def linear_count(model) -> int:
    return sum(type(module) is nn.Linear for module in model.modules())


def op_counts(run) -> dict[str, int]:
    with profile() as prof:
        run()
    return {event.key: event.count for event in prof.key_averages()
            if event.key in ("mkldnn::_reorder_linear_weight", "mkldnn::_linear_pointwise", "aten::linear")}


def test_forwards_are_bit_identical_and_each_weight_is_packed_once(model):
    ids = torch.randint(3, 60, (4, 9))
    with torch.no_grad(), casts_kept(model):
        plain = [model(input_ids=ids[:, :length]).logits for length in (9, 5)]
        with prepacked.linears_prepacked(model):
            counts = op_counts(lambda: [model(input_ids=ids[:, :length]).logits for length in (9, 5)])
            packed = [model(input_ids=ids[:, :length]).logits for length in (9, 5)]
    assert all(same(a, b) for a, b in zip(plain, packed))
    linears = linear_count(model)
    assert counts["mkldnn::_reorder_linear_weight"] == linears  # once per layer over two forwards
    assert counts["mkldnn::_linear_pointwise"] == 2 * linears and "aten::linear" not in counts
    assert not any("forward" in vars(module) for module in model.modules())  # the layers are plain again


def test_nothing_is_packed_with_grad_on_or_when_the_weights_change_per_call(model, dtype):
    ids = torch.randint(3, 60, (2, 6))
    with prepacked.linears_prepacked(model):
        with casts_kept(model):
            counts = op_counts(lambda: model(input_ids=ids).logits.sum().backward())
        assert "mkldnn::_linear_pointwise" not in counts  # training: autograd's F.linear
        model.zero_grad(set_to_none=True)
        with torch.no_grad():  # bf16 casts not kept: every forward casts anew, so packing would repeat every call
            counts = op_counts(lambda: [model(input_ids=ids) for _ in range(3)])
    assert counts["mkldnn::_reorder_linear_weight"] == linear_count(model)  # the first call only
    if dtype == torch.float32:  # no casts: the same weights every call, packed once
        assert counts["mkldnn::_linear_pointwise"] == 3 * linear_count(model) and "aten::linear" not in counts
    else:  # then F.linear for good
        assert counts["aten::linear"] == 2 * linear_count(model)


def counted_packed_products(monkeypatch) -> dict[str, int]:
    """Counts every product against a packed weight (``prepacked.packed_linear``, wherever it is called from)."""
    counts = {"packed": 0}
    original = prepacked.packed_linear

    def counting(*args):
        counts["packed"] += 1
        return original(*args)
    for module in (prepacked, decode_step):
        monkeypatch.setattr(module, "packed_linear", counting)
    return counts


@pytest.mark.parametrize("fast_decode", [True, False], ids=["fast-step", "module"])
def test_generation_is_the_same_with_and_without_packing(model, fast_decode, monkeypatch):
    """Packing off everywhere (the module's linears and the fast step's products): the same tokens, and the same
    log-probs (bf16 bits; fp32 within rounding)."""
    prompts = Batch(tensors={Fields.INPUT_IDS: torch.randint(3, 60, (3, 7)),
                             Fields.ATTENTION_MASK: torch.ones(3, 7, dtype=torch.long)})
    prompts[Fields.ATTENTION_MASK][0, :2] = 0
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=[1], fast_decode=fast_decode)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=5)
    products = counted_packed_products(monkeypatch)  # generation runs on its replica server's thread: no profiler
    packed = engine.generate(prompts, params)
    assert products["packed"] > 0
    for module in (prepacked, decode_step):
        monkeypatch.setattr(module, "prepacking_available", lambda dtype=torch.bfloat16: False)
    products["packed"] = 0
    plain = engine.generate(prompts, params)
    assert products["packed"] == 0
    assert engine.decode_path == ("fast" if fast_decode else "module")
    for field in (Fields.RESPONSES, Fields.RESPONSE_MASK):
        assert torch.equal(packed[field], plain[field]), field
    assert same(packed[Fields.ROLLOUT_LOG_PROBS], plain[Fields.ROLLOUT_LOG_PROBS])


@pytest.mark.skipif(not prepacked.prepacking_available(torch.bfloat16),
                    reason="this CPU / torch build has no oneDNN bf16 prepacked linear (no native bf16)")
def test_a_prompt_forward_of_many_rows_runs_plain_products_and_decode_steps_stay_packed(monkeypatch):
    """At 8 × 43 tokens of 576 (SmolLM2's width) on 2 threads ``F.linear`` sums otherwise than the packed product;
    such a forward runs ``F.linear``, a one-token step of as many rows stays packed."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(576, 576, bias=False)).bfloat16()
    products = counted_packed_products(monkeypatch)
    prompt, step = torch.randn(8, 43, 576).bfloat16(), torch.randn(344, 1, 576).bfloat16()
    with torch.no_grad(), prepacked.linears_prepacked(layer):
        assert torch.equal(layer(prompt), F.linear(prompt, layer[0].weight))
        assert products["packed"] == 0
        layer(step)
        assert products["packed"] == 1
