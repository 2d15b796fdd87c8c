"""The planner's memory model on a GPU: predicted bytes of an actor update (parameters, gradients, optimizer states,
activations) against ``torch.cuda.max_memory_allocated``. Skipped without a CUDA device (``tests/conftest.py``).

Passed on one H200 (2026-11-30 and 2026-12-04). CUDA's attention kernels save slightly different tensors
than sdpa's CPU kernels (the model is derived on CPU, where it matches to within 1 %), hence the wider tolerance;
the printed line says which term to look at if it fails.
"""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.precision import precision_mode
from hybridrl.config.schema import OptimConfig
from hybridrl.planner.memory_plan import trained_role
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.autotune.memory_sizing import DecoderShape, ForwardLayout, probe_peak_bytes
from hybridrl.engines.optim import build_optimizer

pytestmark = pytest.mark.gpu

GPU_TOLERANCE = 0.25


@pytest.mark.parametrize("state_precision,checkpointing", [("fp32", False), ("fp32", True), ("8bit", False)])
def test_predicted_actor_memory_matches_cuda_max_allocated(state_precision, checkpointing):
    if state_precision == "8bit":
        pytest.importorskip("torchao")
    spec = TinyModelSpec(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=1408)
    model = build_tiny_model(spec, 32000, pad_token_id=0, eos_token_id=1).cuda().train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = build_optimizer(model, OptimConfig(state_precision=state_precision))
    model(torch.randint(0, 32000, (1, 8), device="cuda")).logits.sum().backward()
    optimizer.step()
    measured = probe_peak_bytes(model, 8, 512, optimizer=optimizer)
    mode = precision_mode("float32", "float32", state_precision, False)
    predicted = trained_role("actor", DecoderShape.from_hf_config(model.config), ForwardLayout.padded(8, 512, 510),
                             world=1, mode=mode, accumulating=True, checkpointing=checkpointing, param_offload=False)
    print(f"{state_precision} checkpointing={checkpointing}: predicted {predicted.total / 2**20:.1f} MiB "
          f"({predicted}), measured {measured / 2**20:.1f} MiB, ratio {predicted.total / measured:.3f}")
    assert predicted.total == pytest.approx(measured, rel=GPU_TOLERANCE)
