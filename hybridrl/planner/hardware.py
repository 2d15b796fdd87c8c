"""The devices the planner knows: memory, peak dense tensor FLOP/s and memory bandwidth (vendor datasheet figures).

``memory_bytes`` is what ``torch.cuda.get_device_properties(i).total_memory`` reports (a little under the marketing
"GB"); FLOP/s are *dense* (no 2:4 sparsity) tensor-core peaks; ``fp8_flops`` only where the hardware has fp8 tensor
cores (Hopper). Real jobs reach a fraction of peak: the planner's ``efficiency`` factor (default 0.4 — a typical MFU
for RL training with generation in the loop) turns peak into expected time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

GIB = 2**30
TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model: ``memory_bytes`` per device, ``bf16_flops`` / ``fp8_flops`` peak dense FLOP/s,
    ``bandwidth`` in bytes/s."""

    name: str
    memory_bytes: int
    bf16_flops: float
    bandwidth: float
    fp8_flops: Optional[float] = None
    node_link: str = "pcie"
    """How this GPU's servers join the GPUs of one node (a key of :data:`hybridrl.planner.comm_plan.LINKS`)."""

    @property
    def supports_fp8(self) -> bool:
        return self.fp8_flops is not None


GPUS: dict[str, GpuSpec] = {
    # AWS's A10G: 24 GB GDDR6 at 600 GB/s; its tensor peak is below the A10's 125 TFLOP/s (~70 dense bf16); no NVLink.
    "a10g": GpuSpec("A10G 24GB", 23028 * 2**20, 70 * TERA, 600e9),
    "a100-40": GpuSpec("A100 40GB SXM", 40536 * 2**20, 312 * TERA, 1555e9, node_link="nvlink3"),
    "a100-80": GpuSpec("A100 80GB SXM", 81920 * 2**20, 312 * TERA, 2039e9, node_link="nvlink3"),
    "h100": GpuSpec("H100 80GB SXM", 81559 * 2**20, 989 * TERA, 3350e9, fp8_flops=1979 * TERA, node_link="nvlink4"),
    "h200": GpuSpec("H200 141GB SXM", 143771 * 2**20, 989 * TERA, 4800e9, fp8_flops=1979 * TERA,
                    node_link="nvlink4"),
}


def gpu_spec(name: str) -> GpuSpec:
    """The spec of ``name`` (``a10g``, ``a100-40``, ``a100-80``, ``h100``, ``h200``); ``ValueError`` otherwise."""
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; expected one of {', '.join(GPUS)}") from None


def planned_dtype_overrides(overrides: list[str], config_name: str, **dirs) -> list[str]:
    """``overrides`` plus ``model.dtype=bfloat16`` when the config leaves ``model.dtype: auto``: a plan is for a GPU
    (every one of :data:`GPUS` computes in bf16), so ``auto`` resolves as on that GPU, not as on the machine that
    runs the planner (a laptop without bf16 made it plan 7B in fp32, twice the weights)."""
    from hybridrl.config.loader import compose_translated

    raw, _ = compose_translated(config_name, overrides, **dirs)
    if str(raw.get("model", {}).get("dtype", "auto")) != "auto":
        return list(overrides)
    return [*overrides, "model.dtype=bfloat16"]
