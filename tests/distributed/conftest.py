"""Shared set-up for the distributed tests: real Ray on CPU bundles, real gloo process groups.

A module that needs Ray takes the module-scoped ``ray_runtime`` (one private Ray instance per module, shut down after
it); the multi-node module starts its own simulated cluster instead.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from distributed_helpers import ray_config

from hybridrl.runtime import RayRuntime, start_ray


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[RayRuntime]:
    runtime = start_ray(ray_config())
    yield runtime
    runtime.shutdown()
