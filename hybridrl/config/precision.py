"""Precision modes (issue #9 item 4): what each mode costs per parameter, and whether this machine can run it.

Three modes, combinable where it makes sense:

- **standard**: compute in ``model.dtype`` (bf16), fp32 master weights, fp32 gradients, AdamW's two fp32 moments.
- **8-bit optimizer states** (``<role>.optim.state_precision=8bit``): AdamW's moments stored as block-wise quantised
  8-bit codes with one fp32 scale per block of 256 values (torchao's ``AdamW8bit``; bitsandbytes' on CUDA when
  torchao is absent). Master weights and gradients stay fp32.
- **fp8 compute** (``model.fp8_compute=true``): the decoder's linear layers run their matmuls in float8 (torchao
  ``float8`` training, dynamic tensor-wise scaling) on Hopper GPUs (compute capability >= 9.0). Memory per parameter
  is unchanged; matmul throughput doubles at the device's fp8 peak.

This module is pure Python (no torch import at module level): the planner and config validation use it; the training
side lives in :mod:`hybridrl.engines.precision` (8-bit optimizer states) and :mod:`hybridrl.modeling.fp8` (fp8 compute).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from hybridrl.config.errors import ConfigError

OPTIMIZER_STATE_PRECISIONS = ("fp32", "8bit")
# torchao and bitsandbytes quantise the moments in blocks of 256 values, one fp32 scale per block and moment.
EIGHT_BIT_BLOCK_SIZE = 256
FP8_MIN_CAPABILITY = (9, 0)  # Hopper
FP32 = 4
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def optimizer_bytes_per_param(state_precision: str) -> float:
    """AdamW state bytes per parameter: 8 (two fp32 moments) or 2 + 2·4/256 (two 8-bit codes + block scales)."""
    if state_precision == "fp32":
        return 2.0 * FP32
    if state_precision == "8bit":
        return 2.0 * (1 + FP32 / EIGHT_BIT_BLOCK_SIZE)
    raise ValueError(f"unknown optimizer state precision {state_precision!r}; expected one of "
                     f"{', '.join(OPTIMIZER_STATE_PRECISIONS)}")


@dataclass(frozen=True)
class PrecisionMode:
    """Bytes per trained parameter of one precision mode (per rank before sharding) and its matmul dtype."""

    name: str
    compute_bytes: int
    master_bytes: int
    grad_bytes: int
    optimizer_bytes: float
    fp8_matmuls: bool

    @property
    def state_bytes_per_param(self) -> float:
        """Master weights + gradients + optimizer state (what FSDP shards over the ranks)."""
        return self.master_bytes + self.grad_bytes + self.optimizer_bytes


def precision_mode(model_dtype: str, reduce_dtype: str, state_precision: str, fp8_compute: bool) -> PrecisionMode:
    """The mode a config selects (``model.dtype``, ``<role>.fsdp.reduce_dtype``, ``optim.state_precision``, fp8)."""
    parts = ["8-bit optimizer states" if state_precision == "8bit" else "standard"]
    if fp8_compute:
        parts.append("fp8 compute")
    return PrecisionMode(name=" + ".join(parts), compute_bytes=DTYPE_BYTES[model_dtype], master_bytes=FP32,
                         grad_bytes=DTYPE_BYTES[reduce_dtype], optimizer_bytes=optimizer_bytes_per_param(state_precision),
                         fp8_matmuls=fp8_compute)


def standard_modes(model_dtype: str = "bfloat16") -> list[PrecisionMode]:
    """The three modes of issue #9 side by side (for the planner's per-mode table)."""
    return [precision_mode(model_dtype, "float32", "fp32", False), precision_mode(model_dtype, "float32", "8bit", False),
            precision_mode(model_dtype, "float32", "fp32", True)]


# ------------------------------------------------------------------------------------------- what this machine runs
def eight_bit_backend(device_type: str) -> str:
    """The library that provides 8-bit AdamW on ``device_type``: ``torchao`` (CPU and CUDA) or ``bitsandbytes``
    (CUDA only). Raises ``ConfigError`` naming the key when neither can run here."""
    if importlib.util.find_spec("torchao") is not None:
        return "torchao"
    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    if has_bnb and device_type == "cuda":
        return "bitsandbytes"
    reason = ("bitsandbytes' 8-bit optimizers need a CUDA device; install torchao for CPU" if has_bnb else
              "needs torchao (CPU or CUDA) or bitsandbytes (CUDA): pip install 'hybridrl[lowbit]'")
    raise ConfigError([("optim.state_precision", "8bit", reason)])


def check_fp8_compute(device_type: str, capability: tuple[int, int] | None) -> None:
    """Raise ``ConfigError`` (key ``model.fp8_compute``) unless fp8 training can run: CUDA, Hopper, torchao."""
    if device_type != "cuda" or capability is None:
        reason = f"fp8 compute needs a Hopper GPU (compute capability >= 9.0); this run is on {device_type}"
    elif tuple(capability) < FP8_MIN_CAPABILITY:
        reason = f"fp8 compute needs a Hopper GPU (compute capability >= 9.0); this GPU has {capability[0]}.{capability[1]}"
    elif importlib.util.find_spec("torchao") is None:
        reason = "fp8 compute uses torchao's float8 training: pip install 'hybridrl[lowbit]'"
    else:
        return
    raise ConfigError([("model.fp8_compute", True, reason)])


def check_precision_on_device(optim_keys: dict[str, str], fp8_compute: bool, device_type: str,
                              capability: tuple[int, int] | None, error: ConfigError) -> None:
    """Add to ``error`` every precision setting this device cannot run. ``optim_keys``: config key → precision,
    e.g. ``{"actor.optim.state_precision": "8bit"}``."""
    for key, value in optim_keys.items():
        if value == "8bit":
            try:
                eight_bit_backend(device_type)
            except ConfigError as problem:
                error.add(key, value, problem.problems[0][2])
    if fp8_compute:
        try:
            check_fp8_compute(device_type, capability)
        except ConfigError as problem:
            error.extend(problem)
