"""``model.dtype: auto`` — the compute dtype this machine runs fast, decided once when the config is validated.

bf16 on accelerators and on CPUs with native bf16 arithmetic (AVX-512 BF16 or AMX: ``avx512_bf16`` / ``amx_bf16`` in
``/proc/cpuinfo``); fp32 on other CPUs, where torch emulates bf16 matmuls — measured on an AVX2-only EPYC at
1 GFLOP/s against 165 GFLOP/s fp32, so a bf16 run there is two orders of magnitude slower. The choice is logged in
one line; an explicit ``bfloat16`` on a CPU without native bf16 is kept but warned about, with this machine's
measured matmul rates.

``ONEDNN_MAX_CPU_ISA`` (or its old name ``DNNL_MAX_CPU_ISA``) set below ``AVX512_CORE_BF16`` keeps oneDNN, which
runs torch's bf16 matmuls on CPU, off the native bf16 instructions even where the CPU has them, so it counts as no
native bf16 (measured on an AVX-512 BF16 EPYC: bf16 at 1024³ 439 GFLOP/s; with ``AVX2`` 0.9, with
``AVX512_CORE_VNNI`` 74, fp32 ≈ 200 throughout). ``benchmarks/vs_trl.py --cpu-isa`` uses this to measure an
AVX2-only CPU on an AVX-512 one.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

AUTO = "auto"
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ISA_CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# oneDNN's ISA levels below AVX512_CORE_BF16: a cap at one of these leaves bf16 matmuls without native instructions.
ISAS_WITHOUT_NATIVE_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def native_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> Optional[list[str]]:
    """The CPU flags among :data:`NATIVE_BF16_FLAGS` this machine has; ``None`` when the flags cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return None if flags is None else [flag for flag in NATIVE_BF16_FLAGS if flag in flags]


def isa_cap_without_bf16(environ: Optional[dict] = None) -> Optional[str]:
    """``"NAME=VALUE"`` when an oneDNN ISA cap in ``environ`` (default ``os.environ``) excludes native bf16, else
    ``None``."""
    environ = os.environ if environ is None else environ
    for name in ISA_CAP_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return f"{name}={value}" if value.upper() in ISAS_WITHOUT_NATIVE_BF16 else None
    return None


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
    cap = isa_cap_without_bf16() if flags else None
    flags = [] if cap else flags
    chosen = setting if setting != AUTO else ("float32" if flags == [] else "bfloat16")
    if log:
        _explain(setting, chosen, device, flags, key, cap)
    return chosen


def _explain(setting: str, chosen: str, device: str, flags: Optional[list[str]], key: str,
             cap: Optional[str] = None) -> None:
    without = f"{cap} keeps oneDNN off this CPU's native bf16" if cap else \
        "this CPU has no native bf16 — no AVX-512 BF16, no AMX"
    if setting == AUTO and device != "cpu":
        logger.info("%s=auto → bfloat16 (accelerator)", key)
    elif setting == AUTO and chosen == "bfloat16":
        logger.info("%s=auto → bfloat16 (%s)", key, f"this CPU has {', '.join(flags)}" if flags else
                    "the CPU's flags are unreadable")
    elif setting == AUTO:
        logger.info("%s=auto → float32 (%s — so bf16 matmuls would be emulated; set %s=bfloat16 to force it)",
                    key, without, key)
    elif setting == "bfloat16" and flags == []:
        rates = matmul_rates()
        logger.warning("%s=bfloat16 without native bf16 (%s): bf16 matmuls are emulated here — measured %.1f GFLOP/s "
                       "bf16 vs %.1f GFLOP/s fp32; %s=auto (or float32) runs fp32",
                       key, without, rates["bfloat16"], rates["float32"], key)
