"""Job planner (``hybridrl plan``): per-device memory of every role, the largest micro-batch with headroom, memory
savers, a roofline step time and the run's cost — before any GPU is rented. See :func:`plan_job`.

The names below load on first use (PEP 562): the memory model imports torch, and ``hybridrl --help`` (which lists
the GPU types from :mod:`hybridrl.planner.hardware`) should not wait seconds for it (3.6 → 0.3 s). No submodule
shares a name with what it exports (importing it would rebind the package attribute to the module)."""

from __future__ import annotations

import importlib
from typing import Any

_SOURCES = {
    "hybridrl.planner.hardware": ("GPUS", "GpuSpec", "gpu_spec"),
    "hybridrl.planner.memory_plan": ("MemoryPlan", "RoleMemory", "Setup", "Shapes", "plan_memory", "setup_from"),
    "hybridrl.planner.recommendation": ("Recommendation", "recommend"),
    "hybridrl.planner.report": ("JobPlan", "format_plan", "plan_job", "shapes_of"),
    "hybridrl.planner.time_plan": ("StepTime", "roofline_step_time", "run_cost"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value
