"""Declared dispatch: how a controller call to a worker method is spread over the ranks and gathered back.

The decorator sits next to the worker method and is the only place the mode is written::

    class Critic(Worker):
        @dp_split
        def compute_values(self, batch: Batch) -> Batch: ...   # controller gets one Batch back

        @one_to_all
        def save(self, path: str) -> None: ...                  # controller gets [None] * world_size

The decorators return a ``DispatchedMethod``: a descriptor that behaves like the plain method inside the worker
(``self.compute_values(batch)`` works) and carries the mode and the gathered return type for the controller, whose
``group.call(Critic.compute_values, batch)`` is typed ``Batch`` and "go to definition" lands on the ``def`` above.

Modes (``world`` = ranks in the group, ``tp`` = the group's rollout tensor-parallel size, ``dp = world // tp``):

- ``ONE_TO_ALL``: every rank gets the same arguments; gathered as ``[result_rank0, ...]`` (or rank 0's result with
  ``one_to_all(collect="first")`` — every rank still runs, e.g. a collective save).
- ``DP_SPLIT``: each ``Batch`` argument is padded to a multiple of ``world`` (rows repeated cyclically from the start),
  chunked, rank ``r`` gets chunk ``r``; other arguments are broadcast. In a group whose ranks split each sequence
  (``sp`` > 1, Ulysses sequence parallelism) the split is over ``world // sp`` and the ``sp`` peers of chunk ``d``
  (ranks ``d*sp .. d*sp+sp-1``) all receive it; only the first one's results are gathered. ``Batch`` results are concatenated and the
  padding removed (so a method must return one row per input row); other results come back as a per-rank list.
  ``dp_split(pad=False)`` refuses a batch that does not divide evenly (for updates, where a repeated row would count
  twice in the gradient); its ``Batch`` arguments may differ in length (each is chunked on its own, e.g. an RL batch
  and a smaller SFT batch).
- ``DP_LEADERS``: like ``DP_SPLIT`` over the ``dp`` dimension of the ``[dp, tp]`` rollout layout: the TP peers of
  replica ``d`` (ranks ``d*tp .. d*tp+tp-1``) all receive chunk ``d``, and only ``tp_rank == 0`` results are gathered.
- ``RANK_ZERO``: only rank 0 runs; its result is returned.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import (Any, Callable, Concatenate, Generic, Literal, Optional, ParamSpec, Protocol, TypeVar,
                    overload)

from hybridrl.protocol import Batch


class Dispatch(enum.Enum):
    """How a call is spread over ranks and gathered (see the module docstring)."""

    ONE_TO_ALL = "one_to_all"
    DP_SPLIT = "dp_split"
    DP_LEADERS = "dp_leaders"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class DispatchSpec:
    mode: Dispatch
    collect_first: bool = False
    """ONE_TO_ALL only: return rank 0's result instead of the list."""
    pad: bool = True
    """DP_SPLIT / DP_LEADERS: pad batches to a multiple of the DP size (else a non-divisible batch is refused)."""


S = TypeVar("S", contravariant=True)  # the class that defines the method (a Worker subclass)
P = ParamSpec("P")
R = TypeVar("R")
G = TypeVar("G", covariant=True)  # what the controller receives after gathering
BatchT = TypeVar("BatchT", bound=Batch)


class DispatchedMethod(Generic[S, P, R, G]):
    """A worker method with its declared dispatch. Accessed on an instance it is the plain bound method; accessed on
    the class it is this object, which ``WorkerGroup.call`` takes (``name`` is how the worker finds it again)."""

    def __init__(self, fn: Callable[Concatenate[S, P], R], spec: DispatchSpec) -> None:
        if not callable(fn):
            raise TypeError(f"@{spec.mode.value} decorates a method, got {fn!r}")
        self.fn, self.spec = fn, spec
        self.name: str = fn.__name__
        self.owner_name: str = fn.__qualname__.rsplit(".", 1)[0]
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.owner_name = name, owner.__qualname__

    @overload
    def __get__(self, instance: None, owner: Optional[type] = None) -> DispatchedMethod[S, P, R, G]: ...

    @overload
    def __get__(self, instance: S, owner: Optional[type] = None) -> Callable[P, R]: ...

    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        return self.fn.__get__(instance, owner)  # type: ignore[attr-defined]

    def __call__(self, instance: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call unbound, as ``Worker.method(worker, ...)`` would on a plain function."""
        return self.fn(instance, *args, **kwargs)

    @property
    def qualname(self) -> str:
        return f"{self.owner_name}.{self.name}"

    def __repr__(self) -> str:
        return f"<{self.spec.mode.value} method {self.qualname}>"


class _SplitDecorator(Protocol):
    @overload  # Batch results are concatenated; any other result type comes back as a per-rank list
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[Concatenate[S, P], BatchT]) -> DispatchedMethod[S, P, BatchT, BatchT]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[S, P], R]) -> DispatchedMethod[S, P, R, list[R]]: ...


class _FirstDecorator(Protocol):
    def __call__(self, fn: Callable[Concatenate[S, P], R]) -> DispatchedMethod[S, P, R, R]: ...


class _AllDecorator(Protocol):
    def __call__(self, fn: Callable[Concatenate[S, P], R]) -> DispatchedMethod[S, P, R, list[R]]: ...


@overload
def one_to_all(fn: Callable[Concatenate[S, P], R], /) -> DispatchedMethod[S, P, R, list[R]]: ...
@overload
def one_to_all(*, collect: Literal["all"]) -> _AllDecorator: ...
@overload
def one_to_all(*, collect: Literal["first"]) -> _FirstDecorator: ...


def one_to_all(fn: Any = None, /, *, collect: str = "all") -> Any:
    """Every rank runs the method with the same arguments; ``collect="all"`` returns the per-rank list,
    ``collect="first"`` rank 0's result."""
    if collect not in ("all", "first"):
        raise ValueError(f"one_to_all(collect=...) must be 'all' or 'first', got {collect!r}")
    spec = DispatchSpec(Dispatch.ONE_TO_ALL, collect_first=collect == "first")
    return _decorate(fn, spec)


@overload
def dp_split(  # type: ignore[overload-overlap]
        fn: Callable[Concatenate[S, P], BatchT], /) -> DispatchedMethod[S, P, BatchT, BatchT]: ...
@overload
def dp_split(fn: Callable[Concatenate[S, P], R], /) -> DispatchedMethod[S, P, R, list[R]]: ...
@overload
def dp_split(*, pad: bool) -> _SplitDecorator: ...


def dp_split(fn: Any = None, /, *, pad: bool = True) -> Any:
    """Split ``Batch`` arguments over all ranks (one DP shard each); concatenate ``Batch`` results."""
    return _decorate(fn, DispatchSpec(Dispatch.DP_SPLIT, pad=pad))


@overload
def dp_leaders(  # type: ignore[overload-overlap]
        fn: Callable[Concatenate[S, P], BatchT], /) -> DispatchedMethod[S, P, BatchT, BatchT]: ...
@overload
def dp_leaders(fn: Callable[Concatenate[S, P], R], /) -> DispatchedMethod[S, P, R, list[R]]: ...
@overload
def dp_leaders(*, pad: bool) -> _SplitDecorator: ...


def dp_leaders(fn: Any = None, /, *, pad: bool = True) -> Any:
    """Split ``Batch`` arguments over the rollout ``dp`` dimension (TP peers share a chunk); gather ``tp_rank == 0``
    results."""
    return _decorate(fn, DispatchSpec(Dispatch.DP_LEADERS, pad=pad))


def rank_zero(fn: Callable[Concatenate[S, P], R], /) -> DispatchedMethod[S, P, R, R]:
    """Only rank 0 runs the method (no collectives inside!); its result is returned."""
    return DispatchedMethod(fn, DispatchSpec(Dispatch.RANK_ZERO))


def _decorate(fn: Any, spec: DispatchSpec) -> Any:
    if fn is None:
        return lambda method: DispatchedMethod(method, spec)
    return DispatchedMethod(fn, spec)


# ---------------------------------------------------------------------------------------------------------------------
# Planning a call: pure functions, no Ray, so they are tested directly.
# ---------------------------------------------------------------------------------------------------------------------

ArgsKwargs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class CallPlan:
    """Which ranks run with which arguments (``rank_args``), and how their results become one value (``collect``)."""

    rank_args: dict[int, ArgsKwargs]
    collect: Callable[[dict[int, Any]], Any]


def plan_call(method: DispatchedMethod[Any, Any, Any, Any], world_size: int, tp_size: int,
              args: tuple[Any, ...], kwargs: dict[str, Any], share: Callable[[Any], Any], sp_size: int = 1) -> CallPlan:
    """Plan one call. ``share(value)`` stores a value once for several ranks (``ray.put``) and returns what to pass.
    ``sp_size``: ranks that split each sequence (``DP_SPLIT`` gives them the same chunk and gathers their leader's).

    A value bound for one rank only is passed as it is: Ray sends a small one inside the task and stores a large one
    itself, while an explicit ``ray.put`` costs milliseconds even for a few bytes (a one-rank group's every call)."""
    spec = method.spec
    if spec.mode is Dispatch.RANK_ZERO:
        return CallPlan({0: (args, kwargs)}, lambda results: results[0])
    if spec.mode is Dispatch.ONE_TO_ALL:
        shared = _share_all(args, kwargs, _sharing(share, world_size))
        collect = (lambda results: results[0]) if spec.collect_first else _in_rank_order
        return CallPlan({rank: shared for rank in range(world_size)}, collect)
    tp = tp_size if spec.mode is Dispatch.DP_LEADERS else sp_size
    dp_size = world_size // tp
    per_dp, rows_per_rank, pad_count = _split_args(method, dp_size, args, kwargs, _sharing(share, tp),
                                                   _sharing(share, world_size))
    rank_args = {rank: per_dp[rank // tp] for rank in range(world_size)}
    leaders = [d * tp for d in range(dp_size)]
    collect = functools.partial(_collect_split, method=method, leaders=leaders, rows_per_rank=rows_per_rank,
                                pad_count=pad_count)
    return CallPlan(rank_args, collect)


def _sharing(share: Callable[[Any], Any], destinations: int) -> Callable[[Any], Any]:
    """``share`` for a value sent to several ranks; for one rank, the value itself."""
    return share if destinations > 1 else _by_value


def _by_value(value: Any) -> Any:
    return value


def _in_rank_order(results: dict[int, Any]) -> list[Any]:
    return [results[rank] for rank in sorted(results)]


def _share_all(args: tuple[Any, ...], kwargs: dict[str, Any], share: Callable[[Any], Any]) -> ArgsKwargs:
    return tuple(_share_one(a, share) for a in args), {k: _share_one(v, share) for k, v in kwargs.items()}


def _share_one(value: Any, share: Callable[[Any], Any]) -> Any:
    # Small scalars travel inline with each task; anything else is stored once and referenced by every rank.
    if value is None or isinstance(value, (bool, int, float, str, bytes, enum.Enum)):
        return value
    return share(value)


def _split_args(method: DispatchedMethod[Any, Any, Any, Any], dp_size: int, args: tuple[Any, ...],
                kwargs: dict[str, Any], share_chunk: Callable[[Any], Any],
                share_broadcast: Callable[[Any], Any]) -> tuple[list[ArgsKwargs], int, int]:
    """Per-DP-rank ``(args, kwargs)`` (``Batch`` values chunked, others broadcast), rows per rank, pad count.
    ``share_chunk`` stores a chunk for its tensor-parallel peers, ``share_broadcast`` a value for every rank."""
    slots: list[tuple[int | str, Batch]] = [(i, a) for i, a in enumerate(args) if isinstance(a, Batch)]
    slots += [(k, v) for k, v in kwargs.items() if isinstance(v, Batch)]
    if not slots:
        raise TypeError(f"{method.qualname} is declared {method.spec.mode.value}, but the call passed no Batch "
                        "to split")
    sizes = {len(batch) for _, batch in slots}
    if len(sizes) != 1 and method.spec.pad:  # unpadded splits may differ: each Batch is cut evenly on its own
        raise ValueError(f"{method.qualname}: the Batch arguments have different lengths {sorted(sizes)}")
    chunks: dict[int | str, list[Any]] = {}
    pad_count = 0
    for slot, batch in slots:
        padded, pad_count = batch.pad_to_multiple(dp_size)
        if pad_count and not method.spec.pad:
            raise ValueError(f"{method.qualname} splits without padding: a batch of {len(batch)} rows must be "
                             f"divisible by the data-parallel size {dp_size}")
        chunks[slot] = [share_chunk(chunk) for chunk in padded.chunk(dp_size)]
    base_args, base_kwargs = _share_all(
        tuple(None if isinstance(a, Batch) else a for a in args),
        {k: None if isinstance(v, Batch) else v for k, v in kwargs.items()}, share_broadcast)
    per_dp = []
    for d in range(dp_size):
        rank_args = tuple(chunks[i][d] if i in chunks else a for i, a in enumerate(base_args))
        rank_kwargs = {k: chunks[k][d] if k in chunks else v for k, v in base_kwargs.items()}
        per_dp.append((rank_args, rank_kwargs))
    return per_dp, (len(slots[0][1]) + pad_count) // dp_size, pad_count


def _collect_split(results: dict[int, Any], method: DispatchedMethod[Any, Any, Any, Any], leaders: list[int],
                   rows_per_rank: int, pad_count: int) -> Any:
    outputs = [results[rank] for rank in leaders]
    if not all(isinstance(out, Batch) for out in outputs):
        return outputs
    # A method may return k rows per input row, consecutively (generation with n samples per prompt): the padding
    # rows, last in the input, then own the last k × pad_count output rows.
    rows_out = {len(out) for out in outputs}
    if pad_count and (len(rows_out) != 1 or rows_out.pop() % rows_per_rank):
        raise ValueError(f"{method.qualname} returned Batches of lengths {[len(o) for o in outputs]} for inputs of "
                         f"{rows_per_rank} rows each; to remove the {pad_count} padding rows after the gather, every "
                         "rank must return the same whole number of rows per input row")
    merged = Batch.concat(outputs)
    rows_per_input = len(outputs[0]) // rows_per_rank if rows_per_rank else 1
    return merged.unpad(pad_count * rows_per_input) if pad_count else merged
