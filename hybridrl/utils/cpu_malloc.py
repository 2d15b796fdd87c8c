"""glibc ``malloc`` tuning for CPU workers: reuse freed memory instead of returning it to the OS and faulting it in again.

By default glibc serves every allocation above its mmap threshold (128 KiB, rising to at most 32 MiB) with a fresh
``mmap`` and unmaps it on free, and trims the heap's free top. A training step on CPU allocates the same large
tensors every micro-batch (gathered parameters, gradients, logits), so each one is faulted in page by page again:
measured on SmolLM2-135M (2-core AMD EPYC, bf16), the actor's update took 8.3 s with the defaults and 7.3 s with
:func:`keep_freed_memory` (``benchmarks/vs_trl.py``'s update, one rank). The price: the process's resident memory
stays at its peak instead of falling between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # the largest int mallopt takes; the heap's free top is never returned below this


def keep_freed_memory() -> bool:
    """Make this process's glibc ``malloc`` serve all allocations from its heaps (no per-allocation ``mmap``) and
    never trim them. Returns whether ``mallopt`` accepted both settings (``False`` without a C library that has it, e.g.
    on macOS; a preloaded allocator such as tcmalloc may accept and ignore them, and manages its own caches)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
    logger.debug("glibc malloc keeps freed memory: %s", applied)
    return applied
