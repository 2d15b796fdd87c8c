"""Precision modes on a GPU: 8-bit AdamW (torchao, and bitsandbytes where installed) follows fp32 AdamW, and fp8
compute (torchao float8, Hopper only) trains a tiny model with a loss close to bf16's. Skipped without CUDA; the fp8
test also without a Hopper GPU or torchao. Passed on one H200 (2026-11-30 and 2026-12-04) with torchao 0.17; the
bitsandbytes case was skipped there (not installed)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hybridrl.config.schema import OptimConfig
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.optim import build_optimizer
from hybridrl.engines.precision import build_adamw
from hybridrl.modeling.fp8 import apply_fp8_compute

pytestmark = pytest.mark.gpu


def run_steps(optimizer_factory, steps=5):
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 256).cuda()
    optimizer = optimizer_factory(layer)
    for _ in range(steps):
        layer(torch.randn(32, 256, device="cuda")).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return layer.weight.detach()


@pytest.mark.parametrize("library", ["torchao", "bitsandbytes"])
def test_8bit_adamw_on_cuda_follows_adamw(library):
    if importlib.util.find_spec(library) is None:
        pytest.skip(f"{library} is not installed")
    start = run_steps(lambda layer: torch.optim.AdamW(layer.parameters(), lr=0.0), steps=1)
    reference = run_steps(lambda layer: torch.optim.AdamW(layer.parameters(), lr=1e-2))
    if library == "torchao":
        eight_bit = run_steps(lambda layer: build_optimizer(layer, OptimConfig(lr=1e-2, state_precision="8bit")))
    else:
        import bitsandbytes

        eight_bit = run_steps(lambda layer: bitsandbytes.optim.AdamW8bit(layer.parameters(), lr=1e-2))
    assert (eight_bit - reference).abs().max() < 0.05 * (reference - start).abs().max()
    assert build_adamw([torch.nn.Parameter(torch.zeros(4096, device="cuda"))], lr=1e-3, betas=(0.9, 0.99), eps=1e-8,
                       weight_decay=0.0, state_precision="8bit", device_type="cuda") is not None


def test_fp8_compute_on_hopper_trains_close_to_bf16():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("fp8 compute needs a Hopper GPU (compute capability >= 9.0)")
    pytest.importorskip("torchao")
    spec = TinyModelSpec(hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=512)
    inputs = torch.randint(0, 1024, (4, 128), device="cuda")
    losses = {}
    for fp8 in (False, True):
        model = build_tiny_model(spec, 1024, pad_token_id=0, eos_token_id=1, seed=0).cuda()
        if fp8:
            assert apply_fp8_compute(model, torch.device("cuda")) == 2 * 7  # q, k, v, o, gate, up, down per layer
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(inputs, labels=inputs).loss
        loss.backward()
        losses[fp8] = float(loss)
    assert losses[True] == pytest.approx(losses[False], rel=0.05)
