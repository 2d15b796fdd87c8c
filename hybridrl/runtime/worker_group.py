"""Worker groups: N ranks of one worker class, called from the controller through typed, declared dispatch.

::

    critic = WorkerGroup(Critic, pool, name="critic", args=(config.critic,))
    values = critic.call(Critic.compute_values, batch)               # typed Batch; blocks
    values_f = critic.call_async(Critic.compute_values, batch)       # GroupFuture[Batch]; returns at once
    ref_f = actor.call_async(ActorRolloutRef.compute_ref_log_prob, batch)
    values, ref_log_probs = gather(values_f, ref_f)                  # both groups work at the same time

``group.call(Worker.method, ...)`` takes the decorated method itself (not a name), so a type checker checks the
arguments against the method's signature and infers the gathered type, and "go to definition" lands on the
worker's ``def``. The method must belong to the group's worker class (or a base class of it).

Failures never hang the controller: a dead rank raises ``WorkerDiedError`` as soon as Ray reports it; a method that
raises gives ``WorkerError`` with the worker's traceback; a call past its timeout gives ``WorkerTimeoutError``. Death
and timeout stop the whole group (its other ranks may be blocked in a collective with the lost one); so does an
exception after which peers are still running ``failure_grace_s`` later. A stopped group raises
``WorkerGroupStoppedError`` for any further call.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Generic, NoReturn, Optional, ParamSpec, TypeVar, overload

from hybridrl.runtime.dispatch import DispatchedMethod, plan_call
from hybridrl.runtime.errors import (RankLocation, WorkerDiedError, WorkerError, WorkerGroupStoppedError,
                                        WorkerTimeoutError)
from hybridrl.runtime.executors import (Executor, RankFailure, RayExecutor, SerialExecutor, all_finished,
                                           outcome, wait_ready)
from hybridrl.runtime.resource_pool import ResourcePool
from hybridrl.runtime.worker import RankSpec, TimedResult, Worker
from hybridrl.utils.distributed import check_tp_size

W = TypeVar("W", bound=Worker)
P = ParamSpec("P")
G = TypeVar("G")
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")
D = TypeVar("D")

_INIT = "__init__"
GRACEFUL_SHUTDOWN_S = 5.0
"""How long ``shutdown()`` lets the ranks close their workers (engines free process groups and ``/dev/shm``) before it
kills them; a rank still busy with a call (after Ctrl-C) is killed once this passes."""


class WorkerGroup(Generic[W]):
    """``pool.world_size`` ranks of ``worker_cls``, one per bundle of ``pool``, forming one process group.

    Args:
        worker_cls: the ``Worker`` subclass each rank constructs with ``*args, **kwargs``.
        pool: where the ranks run (a local-mode pool runs them in this process, see ``executors``).
        name: the role(s) this group plays, e.g. ``"actor_rollout_ref"``; errors name it.
        tp_size: rollout tensor-parallel size; ranks form a row-major ``[world // tp_size, tp_size]`` layout.
        sp_size: ranks that split each sequence (Ulysses); ``dp_split`` calls give a row-major ``[world // sp_size,
            sp_size]`` layout's peers the same rows.
        bundle_share: fraction of each bundle a rank takes (``0.5`` lets two groups share a pool's devices).
        call_timeout_s / startup_timeout_s: default to ``trainer.ray.call_timeout_s`` / ``startup_timeout_s``.
    """

    def __init__(self, worker_cls: type[W], pool: ResourcePool, *, name: str, args: tuple[Any, ...] = (),
                 kwargs: Optional[dict[str, Any]] = None, tp_size: int = 1, sp_size: int = 1,
                 bundle_share: float = 1.0,
                 call_timeout_s: Optional[float] = None, startup_timeout_s: Optional[float] = None) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"worker_cls must be a subclass of hybridrl.runtime.Worker, got {worker_cls!r}")
        check_tp_size(pool.world_size, tp_size)
        check_tp_size(pool.world_size, sp_size, "sp_size")
        config = pool.runtime.config
        self.worker_cls, self.pool, self.name, self.tp_size = worker_cls, pool, name, tp_size
        self.sp_size = sp_size
        self.call_timeout_s = config.call_timeout_s if call_timeout_s is None else call_timeout_s
        self.failure_grace_s = config.failure_grace_s
        self.locations: list[RankLocation] = []
        self._stopped: Optional[str] = None
        self._worker_seconds: dict[str, float] = {}
        self._worker_bytes: dict[str, dict[str, int]] = {}
        executor_cls = SerialExecutor if pool.local_mode else RayExecutor
        self._executor: Executor = executor_cls(pool, name, bundle_share,
                                                worker_cls.process_profile(*args, **dict(kwargs or {})))
        self._failed = False
        try:
            self._start(args, dict(kwargs or {}), config.startup_timeout_s if startup_timeout_s is None
                        else startup_timeout_s)
        except BaseException:
            self._failed = True
            self.shutdown()
            raise

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    @property
    def is_stopped(self) -> bool:
        return self._stopped is not None

    def call(self, method: DispatchedMethod[W, P, Any, G], /, *args: P.args, **kwargs: P.kwargs) -> G:
        """Run ``method`` on the ranks its dispatch selects and return the gathered result (blocks)."""
        return self.call_async(method, *args, **kwargs).result()

    def call_async(self, method: DispatchedMethod[W, P, Any, G], /, *args: P.args,
                   **kwargs: P.kwargs) -> GroupFuture[G]:
        """Start ``method`` and return at once; ``.result()`` (or ``gather``) waits and gathers."""
        self._check_method(method)
        plan = plan_call(method, self.world_size, self.tp_size, args, kwargs, self._executor.share, self.sp_size)
        handles = {rank: self._executor.submit_execute(rank, method.name, rank_args, rank_kwargs)
                   for rank, (rank_args, rank_kwargs) in plan.rank_args.items()}
        return GroupFuture(self, method.name, handles, plan.collect, self.call_timeout_s)

    def pop_worker_seconds(self) -> dict[str, float]:
        """Seconds spent *inside* the workers per method since the last pop: for each finished call, the slowest
        rank's time in the method (``TimedResult.seconds``), summed over calls. The controller's wall time for the
        same calls minus this is dispatch overhead (split, object store, (de)serialisation, transfer, concat)."""
        seconds, self._worker_seconds = self._worker_seconds, {}
        return seconds

    def _record_worker_seconds(self, method: str, seconds: dict[int, float]) -> None:
        if seconds:
            self._worker_seconds[method] = self._worker_seconds.get(method, 0.0) + max(seconds.values())

    def pop_call_metrics(self) -> dict[str, float]:
        """Both, as step metrics: ``timing_worker/<method>`` (a phase's ``timing/`` wall time minus its methods' is
        the controller's dispatch cost) and ``comm_bytes/<method>/<kind>`` (the planner's figures), since the last
        pop."""
        metrics = {f"timing_worker/{method}": seconds for method, seconds in self.pop_worker_seconds().items()}
        metrics.update({f"comm_bytes/{method}/{kind}": float(moved) for method, kinds in self.pop_worker_bytes().items()
                        for kind, moved in kinds.items() if moved})
        return metrics

    def pop_worker_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes of the collectives each method issued since the last pop, by kind: the largest rank's per call,
        summed over calls (what the planner predicts per rank, :mod:`hybridrl.planner.comm_plan`)."""
        moved, self._worker_bytes = self._worker_bytes, {}
        return moved

    def _record_worker_bytes(self, method: str, moved: dict[int, dict[str, int]]) -> None:
        totals = self._worker_bytes.setdefault(method, {})
        for kind in {kind for per_rank in moved.values() for kind in per_rank}:
            totals[kind] = totals.get(kind, 0) + max(per_rank.get(kind, 0) for per_rank in moved.values())

    def shutdown(self) -> None:
        """End the group (idempotent). The pool stays reserved; release it separately. The processes of a group that
        never failed are parked for the next group when they stopped cleanly (:mod:`hybridrl.runtime.parked`)."""
        if self._stopped is None:
            self._stop("it was shut down", graceful_s=GRACEFUL_SHUTDOWN_S, park=not self._failed)

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = f"stopped: {self._stopped}" if self._stopped else "running"
        return f"WorkerGroup({self.worker_cls.__name__}, name={self.name!r}, world_size={self.world_size}, {state})"

    # -- start-up ----------------------------------------------------------------------------------------------------

    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any], timeout_s: float) -> None:
        """Locate every rank, pick the rendezvous address, then init the process group and construct the workers."""
        deadline = time.monotonic() + timeout_s
        handles = {rank: self._executor.submit_locate(rank) for rank in range(self.world_size)}
        located: GroupFuture[list[tuple[RankLocation, int]]] = GroupFuture(self, "start-up", handles,
                                                                           _in_rank_order, timeout_s)
        located_ranks = located.result()
        self.locations = [location for location, _ in located_ranks]
        master_addr, master_port = self._rendezvous(located_ranks)
        handles = {spec.rank: self._executor.submit_start(spec, self.worker_cls, args, kwargs)
                   for spec in self._rank_specs(master_addr, master_port)}
        GroupFuture(self, _INIT, handles, _in_rank_order, max(deadline - time.monotonic(), 0.0)).result()

    def _rendezvous(self, located: list[tuple[RankLocation, int]]) -> tuple[Optional[str], int]:
        if self.pool.local_mode:
            return None, 0
        rank0, port = located[0]
        single_node = len({location.node_id for location, _ in located}) == 1
        return ("127.0.0.1" if single_node else rank0.node_ip), port

    def _rank_specs(self, master_addr: Optional[str], master_port: int) -> list[RankSpec]:
        slots, spec = self.pool.slots(), self.pool.spec
        timeout_s = max(self.call_timeout_s, 60.0)
        return [RankSpec(self.name, slot.rank, self.world_size, slot.local_rank, spec.devices_per_node, spec.device,
                         self.tp_size, timeout_s, master_addr, master_port) for slot in slots]

    # -- failures ----------------------------------------------------------------------------------------------------

    def _check_method(self, method: Any) -> None:
        if not isinstance(method, DispatchedMethod):
            raise TypeError(f"{getattr(method, '__qualname__', method)!r} has no declared dispatch: decorate it with "
                            "@one_to_all, @dp_split, @dp_leaders or @rank_zero")
        if not isinstance(getattr(self.worker_cls, method.name, None), DispatchedMethod):
            raise TypeError(f"{method.qualname} is not a dispatched method of {self.worker_cls.__qualname__} "
                            f"(group {self.name!r})")
        if self._stopped is not None:
            raise WorkerGroupStoppedError(self.name, None, method.name, None, self._stopped)

    def _location(self, rank: int) -> Optional[RankLocation]:
        return self.locations[rank] if rank < len(self.locations) else None

    def _stop(self, reason: str, graceful_s: float = 0.0, park: bool = False) -> None:
        self._stopped = reason
        self._executor.stop(graceful_s, park)

    def _raise_failure(self, method: str, rank: int, failure: RankFailure, peers: dict[Any, int]) -> NoReturn:
        self._failed = True  # what the workers hold may be anything now: never handed to another group
        location = self._location(rank)
        if failure.died:
            self._stop(f"rank {rank} died during {method}()")
            raise WorkerDiedError(self.name, rank, method, location, "the group was stopped. " + failure.detail)
        detail = failure.detail
        stuck, died = self._settle(peers)
        if died is not None:  # e.g. "connection reset by peer" in a collective: the peer's death is the cause
            dead_rank, death = died
            self._stop(f"rank {dead_rank} died during {method}()")
            raise WorkerDiedError(self.name, dead_rank, method, self._location(dead_rank),
                                  "the group was stopped. " + death.detail)
        if stuck:
            self._stop(f"rank {rank} raised in {method}() while ranks {stuck} kept running")
            detail += (f" (ranks {stuck} were still running {self.failure_grace_s:g} s later, e.g. waiting in a "
                       "collective; the group was stopped)")
        raise WorkerError(self.name, rank, method, location, detail, failure.remote_traceback) from failure.cause

    def _settle(self, peers: dict[Any, int]) -> tuple[list[int], Optional[tuple[int, RankFailure]]]:
        """Give the failed rank's peers ``failure_grace_s`` to finish. Returns the ranks still running after it, and
        the first peer that *died* meanwhile (rank, failure), if any — the likelier root cause of the failure."""
        pending = dict(peers)
        died: Optional[tuple[int, RankFailure]] = None
        deadline = time.monotonic() + self.failure_grace_s
        while pending and time.monotonic() < deadline:
            for handle in wait_ready(list(pending), deadline - time.monotonic()):
                rank = pending.pop(handle)
                try:
                    outcome(handle)
                except RankFailure as peer_failure:
                    if peer_failure.died and died is None:
                        died = (rank, peer_failure)
        return sorted(pending.values()), died

    def _raise_timeout(self, method: str, ranks: list[int], timeout_s: float) -> NoReturn:
        self._failed = True
        self._stop(f"{method}() timed out")
        raise WorkerTimeoutError(self.name, ranks[0], method, self._location(ranks[0]),
                                 f"ranks {ranks} still running after {timeout_s:g} s; the group was stopped "
                                 "(its ranks may be stuck, e.g. in a collective)")


def _in_rank_order(results: dict[int, Any]) -> list[Any]:
    return [results[rank] for rank in sorted(results)]


class GroupFuture(Generic[G]):
    """A call in flight on one group. ``result()`` waits (bounded by the call's timeout) and gathers."""

    def __init__(self, group: WorkerGroup[Any], method: str, handles: dict[int, Any],
                 collect: Callable[[dict[int, Any]], Any], timeout_s: float) -> None:
        self.group, self.method, self.timeout_s = group, method, timeout_s
        self._handles, self._collect = handles, collect
        self._deadline = time.monotonic() + timeout_s
        self._results: dict[int, Any] = {}
        self.worker_seconds: dict[int, float] = {}
        """Per rank, the seconds the method ran inside the worker (filled as ranks finish)."""
        self.worker_bytes: dict[int, dict[str, int]] = {}
        """Per rank, the bytes of the method's collectives by kind (filled as ranks finish)."""
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._settled_once = False  # the value or the error is final

    def result(self, timeout_s: Optional[float] = None) -> G:
        """The gathered result; ``timeout_s`` (from now) replaces the call's own timeout."""
        return gather(self, timeout_s=timeout_s)[0]

    def done(self) -> bool:
        """Whether every rank has finished (successfully or not); never blocks."""
        if self._settled_once:
            return True
        return all_finished([h for rank, h in self._handles.items() if rank not in self._results])

    def _settled(self) -> G:
        if not self._settled_once:
            try:
                self._value = self._collect(self._results)
            except Exception as error:
                self._error = error
            self._settled_once = True
            self.group._record_worker_seconds(self.method, self.worker_seconds)
            self.group._record_worker_bytes(self.method, self.worker_bytes)
            self._results, self._handles = {}, {}  # the gathered value is all that is kept
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        state = "settled" if self._settled_once else f"{len(self._results)}/{len(self._handles)} ranks done"
        return f"GroupFuture({self.group.name}.{self.method}, {state})"


@overload
def gather(f1: GroupFuture[A], /, *, timeout_s: Optional[float] = None) -> tuple[A]: ...
@overload
def gather(f1: GroupFuture[A], f2: GroupFuture[B], /, *, timeout_s: Optional[float] = None) -> tuple[A, B]: ...
@overload
def gather(f1: GroupFuture[A], f2: GroupFuture[B], f3: GroupFuture[C], /, *,
           timeout_s: Optional[float] = None) -> tuple[A, B, C]: ...
@overload
def gather(f1: GroupFuture[A], f2: GroupFuture[B], f3: GroupFuture[C], f4: GroupFuture[D], /, *,
           timeout_s: Optional[float] = None) -> tuple[A, B, C, D]: ...
@overload
def gather(*futures: GroupFuture[Any], timeout_s: Optional[float] = None) -> tuple[Any, ...]: ...


def gather(*futures: GroupFuture[Any], timeout_s: Optional[float] = None) -> tuple[Any, ...]:
    """Wait for several calls together (possibly on different groups) and return their results in order.

    The first failure in any of them raises at once. ``timeout_s`` (from now) replaces each call's own timeout.
    """
    override = None if timeout_s is None else time.monotonic() + timeout_s
    pending = {handle: (future, rank) for future in futures if not future._settled_once
               for rank, handle in future._handles.items() if rank not in future._results}
    while pending:
        waiting = {id(future): future for future, _ in pending.values()}.values()
        first = min(waiting, key=lambda future: future._deadline if override is None else override)
        remaining = (first._deadline if override is None else override) - time.monotonic()
        if remaining <= 0:
            _expire(first, pending, first.timeout_s if timeout_s is None else timeout_s)
        for handle in wait_ready(list(pending), remaining):
            future, rank = pending.pop(handle)
            try:
                result = outcome(handle)
                if isinstance(result, TimedResult):  # a method call (start-up calls return plain values)
                    future.worker_seconds[rank], future.worker_bytes[rank] = result.seconds, result.payload_bytes
                    result = result.value
                future._results[rank] = result
            except RankFailure as failure:
                peers = {h: r for h, (f, r) in pending.items() if f is future}
                _fail(future, lambda failure=failure: future.group._raise_failure(future.method, rank, failure, peers))
    return tuple(future._settled() for future in futures)


def _expire(future: GroupFuture[Any], pending: dict[Any, tuple[GroupFuture[Any], int]], timeout_s: float) -> None:
    ranks = sorted(rank for f, rank in pending.values() if f is future)
    _fail(future, lambda: future.group._raise_timeout(future.method, ranks, timeout_s))


def _fail(future: GroupFuture[Any], raise_error: Callable[[], NoReturn]) -> NoReturn:
    """Run ``raise_error``, remember the error on ``future`` (a later ``result()`` re-raises it) and re-raise."""
    try:
        raise_error()
    except WorkerError as error:
        future._error, future._settled_once = error, True
        raise
