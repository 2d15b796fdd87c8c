"""``ppo_micro_batch_size_per_gpu: auto`` on a CUDA device: the budget read from the allocator, candidates measured by
a real forward/backward (GPU only; passed on one H200, 2026-11-30 and 2026-12-04)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.config.schema import ActorConfig, DataConfig, ModelConfig, RolloutConfig, TrainConfig, TrainerConfig
from hybridrl.config.sizes import role_plan
from hybridrl.utils.tiny_model import TinyModelSpec, build_tiny_model
from hybridrl.engines.micro_batches import DataParallelGroup
from hybridrl.autotune.auto_micro_batch import memory_budget, resolve_plan

pytestmark = pytest.mark.gpu


def test_auto_on_cuda_measures_and_fits_the_free_memory():
    device = torch.device("cuda")
    spec = TinyModelSpec(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=1408)
    model = build_tiny_model(spec, 32000, pad_token_id=0, eos_token_id=1).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = TrainConfig(model=ModelConfig(path="unused", dtype="float32"),
                         actor=ActorConfig(ppo_mini_batch_size=64, ppo_micro_batch_size_per_gpu="auto"),
                         rollout=RolloutConfig(n=1), data=DataConfig(train_batch_size=64, max_prompt_length=1024,
                                                                     max_response_length=1024),
                         trainer=TrainerConfig(device="cuda", n_gpus_per_node=1))
    budget, source = memory_budget(None, device, DataParallelGroup())
    free, total = torch.cuda.mem_get_info(device)
    assert free <= budget <= total and "CUDA" in source
    plan, sized = resolve_plan(config, "actor", model, role_plan(config, "actor"), dp=DataParallelGroup(),
                               device=device, optimizer=optimizer)
    assert plan.micro_batch_size_per_gpu * plan.grad_accum_steps == 64
    assert sized.method == "measured on the device" and sized.decision.predicted_bytes <= 0.85 * budget
    print(sized.line())
    assert all(param.grad is None for param in model.parameters())  # the probe leaves no gradients behind
