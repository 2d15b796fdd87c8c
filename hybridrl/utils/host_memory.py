"""This machine's and this process's host memory, without importing torch (the config validation and the CLI read
it before any model code is loaded)."""

from __future__ import annotations

import os
import resource


def host_memory_mb() -> int:
    """This machine's physical memory in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20


def host_rss_bytes() -> int:
    """Resident set size of this process now (Linux ``/proc/self/statm``; the peak where it is unavailable)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
