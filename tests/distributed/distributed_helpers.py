"""Helpers for the distributed tests (a plain module: ``conftest`` names collide across test folders)."""

from __future__ import annotations

from shared_ray import TEST_RAY_SETTINGS

from hybridrl.config.ray import RayConfig
from hybridrl.runtime import PoolSpec, RayRuntime, ResourcePool


def ray_config(**overrides: object) -> RayConfig:
    """The shared instance's settings (``tests/shared_ray.py``: small, local, quick to fail; workers import
    ``sample_workers`` from this folder) with ``overrides``."""
    return RayConfig(**{**TEST_RAY_SETTINGS, **overrides})  # type: ignore[arg-type]


def cpu_pool(runtime: RayRuntime, name: str, devices: int, nnodes: int = 1) -> ResourcePool:
    """A pool of ``nnodes × devices`` one-CPU bundles; give it back with :func:`stop` (or ``pool.release()``): the
    shared test Ray instance has 16 CPUs for every test of its process."""
    return ResourcePool.create(PoolSpec(name, nnodes=nnodes, devices_per_node=devices, device="cpu"), runtime)


def stop(group) -> None:
    """End a worker group's processes and release its pool's reservation (a group's shutdown keeps the pool)."""
    group.shutdown()
    group.pool.release()
