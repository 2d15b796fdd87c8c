"""Watching the collectives a piece of code issues: counting them (benchmarks and tests of communication patterns,
e.g. one gradient reduce-scatter per FSDP2 group per optimizer step, or one per micro-batch with
``fsdp.grad_sync=micro_batch``) and timing them (the ``comm/*`` step metrics: how long the update spent reducing
gradients).
"""

from __future__ import annotations

import collections
import functools
import sys
import time
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor",
               "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all_single")
FUNCTIONAL = ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor")


class _PatchedCollectives:
    """Inside ``with``, ``torch.distributed``'s collectives (and the functional ones DTensor uses, prefixed
    ``functional.``) are replaced by ``self._wrap(original, name)``; the originals are restored on exit.

    The module attributes are swapped, so code that looks a function up at call time (FSDP2, DTensor) is seen, a
    reference taken before entering is not. Everything is per process (this rank's calls).
    """

    def __init__(self) -> None:
        self._originals: list[tuple[object, str, object]] = []

    def __enter__(self):
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

    def _wrap(self, function: Callable, name: str) -> Callable:
        raise NotImplementedError


class CollectiveCounter(_PatchedCollectives):
    """``with CollectiveCounter() as counter:`` counts calls by name in ``counter.counts`` and the bytes they were
    about in ``counter.payload_bytes`` (by kind, FSDP2's own all-reduces apart: :class:`CollectiveTimer`'s keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.payload_bytes: collections.Counter = collections.Counter()

    def _wrap(self, function, name: str):
        kind = collective_kind(name)

        @functools.wraps(function)
        def counted(*args, **kwargs):
            self.counts[name] += 1
            self.payload_bytes[_issuer_kind(kind, sys._getframe(1))] += payload_bytes(name, args, kwargs)
            return function(*args, **kwargs)

        return counted

    def total(self, kind: str) -> int:
        """Calls whose name contains ``kind`` (e.g. ``"reduce_scatter"``, ``"all_gather"``)."""
        return sum(count for name, count in self.counts.items() if kind in name)


class CollectiveTimer(_PatchedCollectives):
    """``with CollectiveTimer() as timer:`` measures the seconds each kind of collective took on this rank:
    ``timer.seconds()`` → ``{"reduce_scatter": s, "all_gather": s, "all_reduce": s, ...}`` (names without their
    ``_single``/``_tensor``/``_into_tensor`` suffixes), and the bytes each moved: ``timer.payload_bytes`` (see
    :func:`payload_bytes`), keyed by kind, with FSDP2's own all-reduces (HSDP's gradient all-reduce across shard
    groups) as ``fsdp_all_reduce`` apart from the small ones the training loop issues (token counts, metrics).

    A blocking call on CPU tensors (gloo) is timed by the wall clock around it. A call on CUDA tensors is bracketed by
    two timing events on the current stream — FSDP2 issues its gradient reduce-scatter blocking on its own reduce
    stream, so the events measure the collective on the GPU, not the launch — read (one synchronisation) in
    ``seconds()``. An ``async_op=True`` call is counted in ``untimed`` instead: its work finishes after the call returns
    (its bytes are counted all the same).
    """

    def __init__(self) -> None:
        super().__init__()
        self._cpu_seconds: collections.Counter = collections.Counter()
        self._cuda_events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.untimed: collections.Counter = collections.Counter()
        self.payload_bytes: collections.Counter = collections.Counter()

    def _wrap(self, function, name: str):
        kind = collective_kind(name)

        @functools.wraps(function)
        def timed(*args, **kwargs):
            issuer = _issuer_kind(kind, sys._getframe(1))
            self.payload_bytes[issuer] += payload_bytes(name, args, kwargs)
            # seconds by kind, sequence parallelism's apart (FSDP2's all-reduces stay in all_reduce's time)
            timed_kind = issuer if issuer == SEQUENCE_PARALLEL else kind
            if kwargs.get("async_op"):
                self.untimed[timed_kind] += 1
                return function(*args, **kwargs)
            if _on_cuda(args, kwargs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                result = function(*args, **kwargs)
                end.record()
                self._cuda_events.append((timed_kind, start, end))
                return result
            began = time.perf_counter()
            result = function(*args, **kwargs)
            self._cpu_seconds[timed_kind] += time.perf_counter() - began
            return result

        return timed

    def seconds(self) -> dict[str, float]:
        """Seconds per collective kind so far (CUDA events are waited for here)."""
        totals = collections.Counter(self._cpu_seconds)
        for kind, start, end in self._cuda_events:
            end.synchronize()
            totals[kind] += start.elapsed_time(end) / 1000.0
        return dict(totals)


def payload_bytes(name: str, args: tuple, kwargs: dict) -> int:
    """The bytes of the whole tensor a collective call is about, on this rank: an all-gather's gathered output, a
    reduce-scatter's unreduced input, an all-reduce's or a broadcast's tensor (a list form: its tensors summed).

    A ring collective over ``G`` ranks sends ``(G − 1)/G`` of this (all-reduce: twice that) from each rank: the
    planner's link time (:mod:`hybridrl.planner.comm_plan`) starts from the same figure.
    """
    kind = collective_kind(name)
    if name.startswith("functional."):
        return _tensor_bytes(args[0] if args else None)  # DTensor's: an input (scalar norms, not parameters)
    if kind == "all_gather":
        found = kwargs.get("output_tensor", kwargs.get("tensor_list", args[0] if args else None))
    elif kind == "reduce_scatter":
        found = kwargs.get("input", kwargs.get("input_list", args[1] if len(args) > 1 else None))
    else:
        found = kwargs.get("tensor", args[0] if args else None)
    return _tensor_bytes(found)


def _tensor_bytes(value: Optional[object]) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


SEQUENCE_PARALLEL = "sequence_parallel"
"""The kind of every collective Ulysses sequence parallelism issues (its all-to-alls, and the gather of the positions
with its backward all-reduce): activations, not parameters or gradients."""


def _issuer_kind(kind: str, caller) -> str:
    """Who issued the call (the first calling frame outside this module — an inner counter's wrapper is skipped):
    ``fsdp_all_reduce`` for an all-reduce FSDP2 itself issued (``torch.distributed.fsdp``), :data:`SEQUENCE_PARALLEL`
    for any collective of ``hybridrl.modeling.ulysses``, ``kind`` otherwise."""
    while caller is not None and caller.f_globals.get("__name__") == __name__:
        caller = caller.f_back
    module = caller.f_globals.get("__name__", "") if caller is not None else ""
    if module == "hybridrl.modeling.ulysses":
        return SEQUENCE_PARALLEL
    if kind == "all_reduce" and module.startswith("torch.distributed.fsdp"):
        return "fsdp_all_reduce"
    return kind


def collective_kind(name: str) -> str:
    """``reduce_scatter_single`` / ``functional.reduce_scatter_tensor`` → ``reduce_scatter``;
    ``all_gather_into_tensor`` → ``all_gather``."""
    name = name.removeprefix("functional.")
    for suffix in ("_into_tensor", "_single", "_tensor"):
        name = name.removesuffix(suffix)
    return name


def _on_cuda(args: tuple, kwargs: dict) -> bool:
    tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
    return bool(tensors) and tensors[0].is_cuda
