"""``trainer.ray.cpu_kernel_cache_capacity``: the variables ``worker_process_env`` sets bound what oneDNN keeps
resident for kernels of many shapes. Products of one weight at 400 row counts (a decode step's or a micro-batch's
shape changes with each) in a fresh interpreter given the CPU workers' environment, against one given oneDNN's
defaults: the capped process must grow by well under half as much (measured at 64: +67 against +292 MiB)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hybridrl.config.ray import RayConfig
from hybridrl.utils.distributed import KERNEL_CACHE_VARIABLES, worker_process_env

PROBE = """
import json, psutil, torch
from hybridrl.modeling.prepacked import pack_linear_weight, packed_linear
torch.set_num_threads(1)
packed = pack_linear_weight(torch.randn(576, 576))
packed_linear(torch.randn(1, 576), packed, None)
before = psutil.Process().memory_info().rss
for rows in range(2, 402):  # each row count compiles its own oneDNN kernel
    packed_linear(torch.randn(rows, 576), packed, None)
print(json.dumps({"growth_mib": (psutil.Process().memory_info().rss - before) / 2**20}))
"""


def growth_mib(env: dict[str, str]) -> float:
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])["growth_mib"]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"),
                    reason="this torch build has no oneDNN packed products")
def test_the_workers_kernel_cache_bound_holds_oneDNN_memory_down(monkeypatch):
    for key in KERNEL_CACHE_VARIABLES:  # an exported value would be left to the workers
        monkeypatch.delenv(key, raising=False)
    plain = dict(os.environ)
    capacity = RayConfig().cpu_kernel_cache_capacity
    workers = worker_process_env("cpu", {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, capacity)
    assert all(workers[key] == str(capacity) for key in KERNEL_CACHE_VARIABLES)
    defaults, bounded = growth_mib(plain), growth_mib({**plain, **workers})
    assert defaults > 100, defaults  # oneDNN keeps ~0.7 MiB a row count at these widths
    assert bounded < defaults / 2, (bounded, defaults)
