"""fp8 compute (``model.fp8_compute``, Hopper GPUs): the decoder's linear layers as torchao ``Float8Linear``.

torchao is imported here and nowhere else on the model side (an optional GPU extra).
"""

from __future__ import annotations

import torch
from torch import nn

from hybridrl.config.precision import check_fp8_compute


def apply_fp8_compute(model: nn.Module, device: torch.device) -> int:
    """Swap the decoder's ``nn.Linear`` layers for torchao ``Float8Linear`` (dynamic tensor-wise scaling); returns
    how many were converted. The LM head / value head stay in the compute dtype (their output precision matters most),
    and so does any linear whose dimensions are not multiples of 16 (an fp8 matmul requirement).

    Raises ``ConfigError`` (``model.fp8_compute``) off a Hopper GPU or without torchao.
    """
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    check_fp8_compute(device.type, capability)
    from torchao.float8 import convert_to_float8_training

    head_names = {"lm_head", "score", "classifier"}

    def convertible(module: nn.Module, name: str) -> bool:
        if not isinstance(module, nn.Linear) or name.split(".")[-1] in head_names:
            return False
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    before = sum(isinstance(module, nn.Linear) for module in model.modules())
    convert_to_float8_training(model, module_filter_fn=convertible)
    after = sum(type(module) is nn.Linear for module in model.modules())
    return before - after
