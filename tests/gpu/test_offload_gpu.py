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


def test_a_role_whose_optimizer_leaves_between_updates_trains_to_the_same_weights():
    """``critic.fsdp.optimizer_offload``: AdamW's state on the host between updates, on the GPU inside them."""
    from hybridrl.engines.offload import OptimizerOffload

    results = {}
    for offloaded in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1)).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        offload = OptimizerOffload(optimizer, torch.device("cuda"), enabled=offloaded)
        inputs = torch.randn(16, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        for _ in range(3):
            with offload.resident():
                model(inputs).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            assert (optimizer_state_bytes(optimizer, "cuda") == 0) is offloaded
        results[offloaded] = [param.detach().clone() for param in model.parameters()]
    for kept, moved in zip(results[False], results[True]):
        assert torch.equal(kept, moved)
