"""Generation's linears against oneDNN-prepacked bf16 weights (``hybridrl.modeling.prepacked``): the same bits as
``F.linear``, each weight packed once per context, nothing packed with grad on or when weights change per call."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.profiler import profile

import hybridrl.modeling.prepacked as prepacked
from hybridrl.config.schema import ModelConfig
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.single_rank import apply_compute_dtype, casts_kept
from hybridrl.protocol import Batch, Fields
from hybridrl.rollout.base import SamplingParams
from hybridrl.rollout.hf import HFRollout
from hybridrl.utils.tiny_model import save_tiny_model

pytestmark = pytest.mark.skipif(not prepacked.prepacking_available(),
                                reason="this CPU / torch build has no oneDNN bf16 prepacked linear")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """fp32 master weights computing in bf16 on one rank, as the actor on a CPU runs."""
    directory = save_tiny_model(tmp_path_factory.mktemp("prepacked") / "model")
    return apply_compute_dtype(build_model(ModelConfig(path=str(directory), dtype="float32"), "actor"), torch.bfloat16)


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
    assert all(torch.equal(a, b) for a, b in zip(plain, packed))
    linears = linear_count(model)
    assert counts["mkldnn::_reorder_linear_weight"] == linears  # once per layer over two forwards
    assert counts["mkldnn::_linear_pointwise"] == 2 * linears and "aten::linear" not in counts
    assert not any("forward" in vars(module) for module in model.modules())  # the layers are plain again


def test_nothing_is_packed_with_grad_on_or_when_the_weights_change_per_call(model):
    ids = torch.randint(3, 60, (2, 6))
    with prepacked.linears_prepacked(model):
        with casts_kept(model):
            counts = op_counts(lambda: model(input_ids=ids).logits.sum().backward())
        assert "mkldnn::_linear_pointwise" not in counts  # training: autograd's F.linear
        model.zero_grad(set_to_none=True)
        with torch.no_grad():  # casts not kept: every forward casts anew, so packing would repeat every call
            counts = op_counts(lambda: [model(input_ids=ids) for _ in range(3)])
    assert counts["mkldnn::_reorder_linear_weight"] == linear_count(model)  # the first call only, then F.linear
    assert counts["aten::linear"] == 2 * linear_count(model)


def test_generation_is_the_same_with_and_without_packing(model, monkeypatch):
    prompts = Batch(tensors={Fields.INPUT_IDS: torch.randint(3, 60, (3, 7)),
                             Fields.ATTENTION_MASK: torch.ones(3, 7, dtype=torch.long)})
    prompts[Fields.ATTENTION_MASK][0, :2] = 0
    engine = HFRollout(model, pad_token_id=0, eos_token_ids=[1])
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=5)
    packed = engine.generate(prompts, params)
    monkeypatch.setattr(prepacked, "prepacking_available", lambda: False)
    plain = engine.generate(prompts, params)
    for field in (Fields.RESPONSES, Fields.ROLLOUT_LOG_PROBS, Fields.RESPONSE_MASK):
        assert torch.equal(packed[field], plain[field]), field
