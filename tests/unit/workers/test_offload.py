"""Optimizer-state moves on CPU: counts bytes, leaves values and the step counter intact."""

from __future__ import annotations

import torch

from hybridrl.engines.offload import move_optimizer_state, optimizer_state_bytes


def adam_after_one_step():
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 16)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_state_already_on_the_target_device_does_not_move():
    _, optimizer = adam_after_one_step()
    assert move_optimizer_state(optimizer, torch.device("cpu")) == 0


def test_state_bytes_count_both_adam_moments():
    model, optimizer = adam_after_one_step()
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    counted = optimizer_state_bytes(optimizer, "cpu")
    step_bytes = sum(state["step"].numel() * state["step"].element_size() for state in optimizer.state.values())
    assert counted - step_bytes == 2 * parameter_bytes
