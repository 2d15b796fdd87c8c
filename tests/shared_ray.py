"""One private Ray instance per test process (each xdist worker has its own), started on first use and reused while it
is up: a trainer's ``fit`` then finds Ray running and attaches to it instead of starting and stopping its own (about
3.6 s each on the 2-core box). A module that needs a Ray of its own stops it (``ray.shutdown()``, as
``test_multinode`` does); the next user starts it again."""

from __future__ import annotations

from pathlib import Path

_runtime = None


TEST_RAY_SETTINGS = dict(num_cpus=16, object_store_memory_mb=200, failure_grace_s=1.0, placement_timeout_s=5.0,
                         startup_timeout_s=300.0,
                         worker_env={"PYTHONPATH": str(Path(__file__).resolve().parent / "distributed")})
"""Small, local, quick-to-fail settings; workers can import ``tests/distributed``'s sample workers. The start-up
guard is the product default (300 s), not shorter: inside the parallel suite (3 test processes, load 8-10 on 2
cores) a 2-rank actor group once took 33 s to locate its ranks and more than 86 s to construct them, and a 120 s
guard failed a clean-clone CI run with nothing wrong."""


def shared_ray_runtime():
    """The shared runtime (:data:`TEST_RAY_SETTINGS`)."""
    global _runtime
    import ray

    from hybridrl.config.ray import RayConfig
    from hybridrl.runtime import start_ray

    if _runtime is None or not ray.is_initialized():
        _runtime = start_ray(RayConfig(**TEST_RAY_SETTINGS))
    return _runtime


def stop_shared_ray() -> None:
    if _runtime is not None:
        _runtime.shutdown()
