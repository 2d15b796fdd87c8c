"""Shared set-up for the distributed tests: real Ray on CPU bundles, real gloo process groups.

A module that needs Ray takes ``ray_runtime``: the process's shared private instance (``tests/conftest.py``; up for
the whole session, not one per module). The multi-node module stops it and starts its own simulated cluster.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from shared_ray import shared_ray_runtime

from hybridrl.runtime import RayRuntime


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[RayRuntime]:
    yield shared_ray_runtime()
