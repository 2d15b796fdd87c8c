"""The optimizer side of the precision modes (see :mod:`hybridrl.config.precision`): 8-bit AdamW states, and the
bytes a (possibly quantised or sharded) tensor occupies. fp8 compute is :mod:`hybridrl.modeling.fp8`.

Optional backends (torchao, bitsandbytes) are imported here and nowhere else on the optimizer side.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.config.errors import ConfigError
from hybridrl.config.precision import eight_bit_backend


def build_adamw(params: list[nn.Parameter], *, lr: float, betas: tuple[float, float], eps: float,
                weight_decay: float, state_precision: str, device_type: str) -> torch.optim.Optimizer:
    """AdamW whose two moments are kept in fp32 (``state_precision="fp32"``) or as 8-bit block-quantised codes.

    8-bit: torchao's ``AdamW8bit`` (tensors of >= 4096 values whose size divides into blocks of 256 are quantised;
    smaller ones, like norm weights, stay fp32), or bitsandbytes' ``AdamW8bit`` on CUDA without torchao.
    """
    if state_precision == "fp32":
        # fused: one pass over parameter, gradient and both moments per step, on CPU and CUDA alike. On this
        # project's 2-core CPU box it is 10x faster than foreach over SmolLM2-135M's shapes (0.05 s vs 0.51 s a step;
        # benchmarks/optimizer_step.py, 2026-12-02), equal up to rounding (3.6e-7 after 9 steps). Since it came in, both
        # demos still learn at this code (arithmetic 69.5 -> 94.0 %, agent 53.0 -> 76.0 %).
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True)
    if state_precision != "8bit":
        raise ConfigError([("optim.state_precision", state_precision, "unknown; expected one of fp32, 8bit")])
    if eight_bit_backend(device_type) == "bitsandbytes":
        import bitsandbytes

        return bitsandbytes.optim.AdamW8bit(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return _torchao_adamw8bit_class()(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def _torchao_adamw8bit_class() -> type:
    from torchao.optim import AdamW8bit

    class TorchaoAdamW8bit(AdamW8bit):
        """torchao's ``AdamW8bit``, stepping eagerly on CPU.

        torchao compiles its per-parameter update with inductor, once per distinct parameter shape: on CUDA that
        pays for itself; on CPU the C++ compile costs tens of seconds per shape (measured: about 20 s for one
        512×512 linear on this machine's 2 cores) for tensors whose update takes milliseconds eagerly.
        """

        @torch.no_grad()
        def step(self, closure=None):
            on_cpu = all(param.device.type == "cpu" for group in self.param_groups for param in group["params"])
            if not on_cpu:
                return super().step(closure)
            with torch.compiler.set_stance("force_eager"):
                return super().step(closure)

    return TorchaoAdamW8bit


def learning_rate(optimizer: torch.optim.Optimizer) -> float:
    """The first group's learning rate as a float (torchao keeps it as a 0-d tensor so the LR can change in place)."""
    return float(optimizer.param_groups[0]["lr"])


def plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors that hold ``tensor``'s data on this rank: a DTensor's local shard; a wrapper subclass's inner
    tensors (torchao's 8-bit optimizer state: uint8 codes, fp32 block scales, its code book) — such a subclass
    reports the dtype it stands for, not what it stores."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if not hasattr(local, "__tensor_flatten__"):
        return [local]
    names, _ = local.__tensor_flatten__()
    return [plain for name in names for plain in plain_tensors(getattr(local, name))]


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor occupies on this rank, wrapper subclasses (torchao's 8-bit state) included."""
    return sum(plain.numel() * plain.element_size() for plain in plain_tensors(tensor))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state`` except the step counters."""
    return sum(tensor_bytes(value) for state in optimizer.state.values() for key, value in state.items()
               if isinstance(value, torch.Tensor) and key != "step")
