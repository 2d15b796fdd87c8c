"""``trainer.ray.cpu_keep_freed_memory``: after ``keep_freed_memory()`` a large tensor allocated again and again soon
reuses freed heap pages instead of faulting fresh ones in, and the process's memory stops growing (checked by
counting minor page faults and reading RSS, in a fresh interpreter so this test process's allocator is left alone)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys, psutil, torch
from hybridrl.utils.cpu_malloc import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
def one_allocation():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tensor = torch.ones(64 * 2**20 // 4)  # 64 MiB, above glibc's largest mmap threshold (32 MiB)
    del tensor
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before, psutil.Process().memory_info().rss
steps = [one_allocation() for _ in range(24)]
print(json.dumps({"applied": applied, "faults": [f for f, _ in steps[-6:]], "rss": [r for _, r in steps[-6:]]}))
"""


def probe(mode: str) -> dict:
    result = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                            check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt is Linux-only")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = probe("default"), probe("keep")
    pages = 64 * 2**20 // 4096
    assert kept["applied"] is True
    assert min(default["faults"]) > pages // 2, default  # glibc's default: a fresh mapping every time
    assert max(kept["faults"]) < pages // 20, kept  # kept: after a few rounds the freed heap pages are reused ...
    assert max(kept["rss"]) - min(kept["rss"]) < 2**20, kept  # ... and the heap no longer grows
