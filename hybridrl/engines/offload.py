"""Memory phases of the hybrid engine: move the actor's optimizer state off the device while the rollout runs.

Generation needs room for the KV cache; Adam's two fp32 moments are 2× the parameter bytes and idle until the next
update. ``actor.fsdp.optimizer_offload=true`` moves them to CPU before each generation and back before the next
update (and before a checkpoint is written).
"""

from __future__ import annotations

import torch


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> int:
    """Move every tensor of ``optimizer.state`` to ``device`` in place; returns the bytes that moved.

    DTensor states (FSDP2 shards) move shard by shard; the step counters stay where Adam keeps them.
    """
    moved = 0
    non_blocking = device.type == "cpu" and torch.cuda.is_available()
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device != device and key != "step":
                state[key] = value.to(device, non_blocking=non_blocking)
                moved += value.numel() * value.element_size()
    if non_blocking:
        torch.cuda.synchronize()
    return moved


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, device_type: str) -> int:
    """Bytes of optimizer state currently on devices of ``device_type`` (``"cuda"`` or ``"cpu"``)."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor) and value.device.type == device_type)
