"""Threads a module keeps for its process's whole life (an idle pool it reuses), named by prefix.

A worker process is handed to another group only when its worker left no thread running
(:mod:`hybridrl.runtime.reuse`); a pool like the replica server's callers outlives every worker on purpose and is
not such a leftover. A module that keeps one says so here, next to where it creates it.
"""

from __future__ import annotations

KEPT_THREAD_PREFIXES: set[str] = set()


def kept_for_the_process(prefix: str) -> str:
    """Declare that threads named ``prefix…`` belong to the process, not to the worker that started them; returns
    ``prefix`` (for the pool's ``thread_name_prefix``)."""
    KEPT_THREAD_PREFIXES.add(prefix)
    return prefix


def kept(thread_name: str) -> bool:
    return any(thread_name.startswith(prefix) for prefix in KEPT_THREAD_PREFIXES)
