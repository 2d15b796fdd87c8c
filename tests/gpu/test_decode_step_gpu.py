"""The fast decode step on a CUDA device (``rollout.hf_fast_decode``): the module forward's logits within bf16
rounding (the module runs sdpa there, the step its own attention, so the bits may differ) and the same greedy tokens.
GPU only; written without a device to run it on yet."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from hybridrl.modeling.decode_step import DecodeStep
from hybridrl.modeling.positions import position_ids_from_mask
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
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                    past_key_values=DynamicCache(config=model.config), use_cache=True)
        reference = out.past_key_values
        cache = [[keys.clone(), values.clone()] for keys, values in DecodeStep.cache_from(reference)]
        step = DecodeStep(model)
        token, positions = out.logits[:, -1].argmax(-1, keepdim=True), position_ids_from_mask(mask)[:, -1:] + 1
        for _ in range(8):
            mask = torch.cat([mask, torch.ones_like(token)], dim=1)
            expected = model(input_ids=token, attention_mask=mask, position_ids=positions,
                             past_key_values=reference, use_cache=True).logits[:, -1]
            got = step(token, positions, mask, cache)
            torch.testing.assert_close(got.float(), expected.float(), atol=3e-2, rtol=3e-2)
            token, positions = expected.argmax(-1, keepdim=True), positions + 1
