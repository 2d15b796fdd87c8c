"""Counting the collectives a piece of code issues — for benchmarks and tests of communication patterns (e.g. one
gradient reduce-scatter per FSDP2 group per optimizer step, or one per micro-batch with ``fsdp.grad_sync=micro_batch``).
Diagnostics only: nothing in training uses it.
"""

from __future__ import annotations

import collections
import functools

import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single")
FUNCTIONAL = ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor")


class CollectiveCounter:
    """Inside ``with CollectiveCounter() as counter:``, calls of ``torch.distributed``'s collectives (and the
    functional ones DTensor uses) are counted by name in ``counter.counts`` (functional ones prefixed
    ``functional.``); the original functions are restored on exit.

    The module attributes are swapped, so code that looks a function up at call time (FSDP2, DTensor) is counted,
    a reference taken before entering is not. Counts are per process (this rank's calls).
    """

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self._originals: list[tuple[object, str, object]] = []

    def __enter__(self) -> "CollectiveCounter":
        for module, names, prefix in ((dist, COLLECTIVES, ""), (funcol, FUNCTIONAL, "functional.")):
            for name in names:
                if hasattr(module, name):
                    original = getattr(module, name)
                    self._originals.append((module, name, original))
                    setattr(module, name, self._wrap(original, prefix + name))
        return self

    def __exit__(self, *exc) -> None:
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()

    def _wrap(self, function, name: str):
        @functools.wraps(function)
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return function(*args, **kwargs)

        return counted

    def total(self, kind: str) -> int:
        """Calls whose name contains ``kind`` (e.g. ``"reduce_scatter"``, ``"all_gather"``)."""
        return sum(count for name, count in self.counts.items() if kind in name)
