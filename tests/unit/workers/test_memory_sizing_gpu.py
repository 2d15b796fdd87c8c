"""The CUDA memory probe: ``max_memory_allocated`` of a real forward/backward against the analytic model, and an
out-of-memory probe reported as "does not fit". Skipped without a CUDA device (``tests/conftest.py``).

The analytic model is derived for sdpa's CPU kernels; CUDA's kernels (flash / memory-efficient attention) save
slightly different tensors and cuBLAS keeps a workspace, hence the wider tolerance than on CPU. Not yet run on a GPU
when written (the session had none): if it fails, the printed breakdown says which term drifted.
"""

from __future__ import annotations

import math

import pytest
import torch

from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.autotune.memory_sizing import (
    DecoderShape,
    Precision,
    choose_micro_batch_size,
    estimate_micro_batch_bytes,
    make_probe,
    probe_peak_bytes,
)

pytestmark = pytest.mark.gpu

GPU_TOLERANCE = 0.25


@pytest.fixture(scope="module")
def cuda_model():
    spec = TinyModelSpec(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=1408)
    return build_tiny_model(spec, 32000, pad_token_id=0, eos_token_id=1).cuda().train()


def test_cuda_probe_matches_the_analytic_total(cuda_model):
    measured = probe_peak_bytes(cuda_model, 8, 512)
    estimate = estimate_micro_batch_bytes(DecoderShape.from_hf_config(cuda_model.config), 8, 512,
                                          precision=Precision(optimizer_bytes_per_param=0))
    print(f"measured {measured / 2**20:.1f} MiB, predicted {estimate.total / 2**20:.1f} MiB: {estimate}")
    assert measured == pytest.approx(estimate.total, rel=GPU_TOLERANCE)
    assert all(param.grad is None for param in cuda_model.parameters())


def test_cuda_out_of_memory_is_not_fitting(cuda_model):
    # [1024 × 65536] logits at a 32k vocabulary are 8 TiB in fp32: no device has that
    assert probe_peak_bytes(cuda_model, 1024, 65536) == math.inf
    torch.cuda.empty_cache()


def test_cuda_decision_with_the_probe(cuda_model):
    budget = torch.cuda.get_device_properties(0).total_memory
    decision = choose_micro_batch_size(budget, seq_len=1024, local_mini_batch_size=64,
                                       measure_fn=make_probe(cuda_model))
    assert decision.micro_batch_size * decision.grad_accum_steps == 64
    assert decision.predicted_bytes <= 0.85 * budget
