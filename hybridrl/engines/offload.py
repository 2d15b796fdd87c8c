"""Memory phases of the hybrid engine: move a role's optimizer state off the device while it is idle.

Adam's two fp32 moments are 2× the parameter bytes and idle outside their role's update. With
``actor.fsdp.optimizer_offload=true`` the actor's move to CPU before each generation (room for the KV cache) and
back before the next update; with ``critic.fsdp.optimizer_offload=true`` the critic's leave after each critic update
and come back for the next one — so generation, the log-prob forwards and the actor's update have its share (13 GiB
per device for a 7B critic on 4 GPUs). Both come back before a checkpoint is written or read.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device, *, copy: bool = False) -> int:
    """Move every tensor of ``optimizer.state`` to ``device`` in place; returns the bytes that moved.

    DTensor states (FSDP2 shards) move shard by shard; the step counters stay where Adam keeps them. ``copy``: a
    state already on ``device`` moves to new storage as well (what a round trip through another device does to it,
    which a CPU-only test can then exercise).
    """
    moved = 0
    non_blocking = device.type == "cpu" and torch.cuda.is_available()
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and (copy or value.device != device) and key != "step":
                state[key] = value.to(device, non_blocking=non_blocking, copy=copy)
                moved += value.numel() * value.element_size()
    if non_blocking:
        torch.cuda.synchronize()
    return moved


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, device_type: str) -> int:
    """Bytes of optimizer state currently on devices of ``device_type`` (``"cuda"`` or ``"cpu"``)."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor) and value.device.type == device_type)


class OptimizerOffload:
    """A role's optimizer state, kept on the host while the role is idle (``*.fsdp.optimizer_offload``).

    ``offload()`` / ``reload()`` move it; ``resident()`` brings it back for a block (an update, a checkpoint) and
    sends it away again after. Nothing moves when ``enabled`` is false or the role's ``device`` is the CPU (the
    state is on the host already) — unless ``copy_on_cpu``, which moves it into new storage both ways so the round
    trip itself can be tested without an accelerator.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, enabled: bool,
                 copy_on_cpu: bool = False) -> None:
        self.optimizer, self.device = optimizer, device
        self.active = enabled and (device.type != "cpu" or copy_on_cpu)
        self.copy = copy_on_cpu and device.type == "cpu"

    def offload(self) -> int:
        """Send the state to the host; the bytes that moved."""
        return move_optimizer_state(self.optimizer, torch.device("cpu"), copy=self.copy) if self.active else 0

    def reload(self) -> int:
        """Bring the state back to the role's device; the bytes that moved."""
        return move_optimizer_state(self.optimizer, self.device, copy=self.copy) if self.active else 0

    @contextmanager
    def resident(self) -> Iterator[None]:
        """The state on the device inside, on the host after (also when the block raises)."""
        self.reload()
        try:
            yield
        finally:
            self.offload()
