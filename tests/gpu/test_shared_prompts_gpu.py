"""``model.share_prompts`` on a GPU: sdpa receives the group rows' custom boolean mask on CUDA and gives the padded
rows' log-probs and gradients (fp32), and close ones in bf16; flash-attn 2 keeps padded rows. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.modeling.sequences import response_log_probs
from hybridrl.modeling.shared_prompts import attention_takes_custom_mask

pytestmark = pytest.mark.gpu


def rows_with_shared_prompts(device):
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 60, (8, 12), generator=generator)
    input_ids[1::2, :6] = input_ids[0::2, :6]
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2:4, :2] = 0  # a shorter prompt pair
    attention_mask[1, 9:] = 0  # a short response
    return (input_ids * attention_mask).to(device), attention_mask.to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_prompts_equal_padded_rows_on_cuda(dtype):
    model = build_tiny_model(TinyModelSpec(num_heads=4, num_kv_heads=2), 64, pad_token_id=0, eos_token_id=1)
    model.config._attn_implementation = "sdpa"
    model = model.to("cuda", dtype)
    assert attention_takes_custom_mask(model)
    input_ids, attention_mask = rows_with_shared_prompts("cuda")
    results = []
    for share in (False, True):
        model.zero_grad()
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, 6, share_prompts=share)
        log_probs.sum().backward()
        results.append((log_probs.detach().float(), [p.grad.float().clone() for p in model.parameters()]))
    tolerance = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=0.05, rtol=0.05)
    torch.testing.assert_close(results[1][0], results[0][0], **tolerance)
    if dtype == torch.float32:
        for got, want in zip(results[1][1], results[0][1]):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-3)
    model.config._attn_implementation = "flash_attention_2"
    assert not attention_takes_custom_mask(model)
