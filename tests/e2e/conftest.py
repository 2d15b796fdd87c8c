"""The e2e runs attach to the process's shared Ray instance instead of each starting its own (``tests/shared_ray.py``)."""

import pytest
from shared_ray import shared_ray_runtime


@pytest.fixture(autouse=True)
def _shared_ray():
    shared_ray_runtime()
