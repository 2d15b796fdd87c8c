"""Optimizer-state offload during generation frees device memory and restores the state exactly (GPU only)."""

from __future__ import annotations

import pytest
import torch

from hybridrl.engines.offload import move_optimizer_state, optimizer_state_bytes

pytestmark = pytest.mark.gpu


def test_optimizer_state_round_trip_frees_gpu_memory():
    model = torch.nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    optimizer.step()
    before = {key: value.clone() for key, value in optimizer.state[model.weight].items()}
    on_gpu = optimizer_state_bytes(optimizer, "cuda")
    allocated = torch.cuda.memory_allocated()
    moved = move_optimizer_state(optimizer, torch.device("cpu"))
    assert moved == on_gpu and optimizer_state_bytes(optimizer, "cuda") == 0
    assert torch.cuda.memory_allocated() <= allocated - moved // 2
    move_optimizer_state(optimizer, torch.device("cuda"))
    for key, value in optimizer.state[model.weight].items():
        assert torch.equal(value.cpu(), before[key].cpu())
