"""``model.dtype: auto`` — the compute dtype this machine runs fast, decided once when the config is validated.

bf16 on accelerators and on CPUs with native bf16 arithmetic (AVX-512 BF16 or AMX: ``avx512_bf16`` / ``amx_bf16`` in
``/proc/cpuinfo``); fp32 on other CPUs, where torch emulates bf16 matmuls — measured on an AVX2-only EPYC at
1 GFLOP/s against 165 GFLOP/s fp32, so a bf16 run there is two orders of magnitude slower. The choice is logged in
one line; an explicit ``bfloat16`` on a CPU without native bf16 is kept but warned about, with this machine's
measured matmul rates.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

AUTO = "auto"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> Optional[list[str]]:
    """The CPU flags among :data:`NATIVE_BF16_FLAGS` this machine has; ``None`` when the flags cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return None if flags is None else [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def matmul_rates(size: int = 256, seconds: float = 0.05) -> dict[str, float]:
    """GFLOP/s of a ``[size, size]`` matmul in fp32 and bf16 with this process's threads (best of ~``seconds``)."""
    import torch

    rates = {}
    for name in ("float32", "bfloat16"):
        a = torch.randn(size, size, dtype=getattr(torch, name))
        torch.matmul(a, a)
        best, deadline = float("inf"), time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            torch.matmul(a, a)
            best = min(best, time.perf_counter() - started)
        rates[name] = 2 * size ** 3 / best / 1e9
    return rates


def resolve_dtype(setting: str, device: str, key: str = "model.dtype",
                  cpuinfo: Path = Path("/proc/cpuinfo"), log: bool = True) -> str:
    """The concrete dtype for ``setting`` on ``device`` (``cpu`` / ``cuda``): ``auto`` is fp32 only on a CPU whose
    flags show no native bf16, else bf16. Logs an ``auto`` choice and warns about an explicit bf16 on a CPU that
    emulates it (``log=False``: neither)."""
    flags = native_bf16_flags(cpuinfo) if device == "cpu" else None
    chosen = setting if setting != AUTO else ("float32" if flags == [] else "bfloat16")
    if log:
        _explain(setting, chosen, device, flags, key)
    return chosen


def _explain(setting: str, chosen: str, device: str, flags: Optional[list[str]], key: str) -> None:
    if setting == AUTO and device != "cpu":
        logger.info("%s=auto → bfloat16 (accelerator)", key)
    elif setting == AUTO and chosen == "bfloat16":
        logger.info("%s=auto → bfloat16 (%s)", key, f"this CPU has {', '.join(flags)}" if flags else
                    "the CPU's flags are unreadable")
    elif setting == AUTO:
        logger.info("%s=auto → float32 (this CPU has no native bf16 — no AVX-512 BF16, no AMX — so bf16 matmuls "
                    "would be emulated; set %s=bfloat16 to force it)", key, key)
    elif setting == "bfloat16" and flags == []:
        rates = matmul_rates()
        logger.warning("%s=bfloat16 on a CPU without native bf16 (no AVX-512 BF16, no AMX): bf16 matmuls are emulated "
                       "here — measured %.1f GFLOP/s bf16 vs %.1f GFLOP/s fp32; %s=auto (or float32) runs fp32",
                       key, rates["bfloat16"], rates["float32"], key)
