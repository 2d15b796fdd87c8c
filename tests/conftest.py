"""Suite-wide test settings: quiet, deterministic, CPU-only, and never touching the network."""

import os

# Nothing in the suite may download models or data; make any accidental hub access fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Ray: local-only, no auth token, no usage stats (see ../shared/ENVIRONMENT.md). Set before any `import ray`.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402
import torch  # noqa: E402
from shared_ray import shared_ray_runtime, stop_shared_ray  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def shared_ray():
    """The process's shared Ray runtime (``tests/shared_ray.py``)."""
    return shared_ray_runtime()


def pytest_sessionfinish(session, exitstatus):
    stop_shared_ray()


def pytest_collection_modifyitems(config, items):
    """Skip GPU-marked tests cleanly, with the reason, where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is present on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
