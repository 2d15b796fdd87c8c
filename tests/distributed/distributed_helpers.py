"""Helpers for the distributed tests (a plain module: ``conftest`` names collide across test folders)."""

from __future__ import annotations

from pathlib import Path

from hybridrl.config.ray import RayConfig
from hybridrl.runtime import PoolSpec, RayRuntime, ResourcePool

TESTS_DIR = str(Path(__file__).resolve().parent)


def ray_config(**overrides: object) -> RayConfig:
    """Small, local, quick-to-fail settings; workers can import ``sample_workers`` from this folder."""
    settings: dict[str, object] = dict(num_cpus=16, object_store_memory_mb=200, failure_grace_s=1.0,
                                       placement_timeout_s=5.0, startup_timeout_s=120.0,
                                       worker_env={"PYTHONPATH": TESTS_DIR})
    settings.update(overrides)
    return RayConfig(**settings)  # type: ignore[arg-type]


def cpu_pool(runtime: RayRuntime, name: str, devices: int, nnodes: int = 1) -> ResourcePool:
    """A pool of ``nnodes × devices`` one-CPU bundles."""
    return ResourcePool.create(PoolSpec(name, nnodes=nnodes, devices_per_node=devices, device="cpu"), runtime)
