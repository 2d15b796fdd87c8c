"""The fast decode step on a CUDA device (``rollout.hf_fast_decode``): the module forward's logits within bf16
rounding at every step (the module runs sdpa there, the step its own attention, so the bits may differ).
GPU only; passed on one H200 (2026-12-04, torch 2.11 + CUDA 13)."""

from __future__ import annotations

import pytest
import torch
from decode_parity import decode_both_ways

from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_decode_step_matches_the_module_on_cuda():
    torch.manual_seed(0)
    spec = TinyModelSpec(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=704)
    model = build_tiny_model(spec, 1000, pad_token_id=0, eos_token_id=1).to("cuda", torch.bfloat16).eval()
    ids = torch.randint(2, 1000, (16, 24), device="cuda")
    mask = torch.ones_like(ids)
    mask[::3, :5] = 0
    pairs, _, _ = decode_both_ways(model, ids, mask, steps=8)
    for got, expected in pairs:
        torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
