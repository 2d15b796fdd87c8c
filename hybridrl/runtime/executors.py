"""Executors run a group's ranks: ``RayExecutor`` (one Ray actor per rank, in a placement-group bundle) and
``SerialExecutor`` (local mode: every rank's ``WorkerHost`` lives in the controller process).

**Local mode semantics** (``trainer.ray.local_mode=true``): a group of N ranks is N worker objects in the controller
process, called one after another in rank order, each with its own ``rank``/``world_size`` — dispatch (splitting,
padding, gathering) behaves exactly as with Ray. With N > 1 there is **no process group** (``dp_mesh`` is ``None``;
collectives cannot work when ranks run one at a time). With N = 1 the rank gets a real one-rank gloo/NCCL group and
meshes, so FSDP code runs unchanged under a debugger. Calls run eagerly inside ``call_async`` (the returned future is
already complete). Method arguments and results are copied through pickle, as Ray would, so a worker never aliases the
controller's tensors and an unpicklable argument fails here too, not first on the cluster.

Both executors hand out *handles*: ``ray.ObjectRef`` for Ray, ``Done`` for serial calls. ``wait_ready`` and
``outcome`` work on either, so one ``gather`` can wait on futures of several groups at once.
"""

from __future__ import annotations

import functools
import logging
import pickle
import re
import traceback
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import ray
import ray.exceptions
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridrl.runtime.parked import PARKED, HostKey
from hybridrl.runtime.resource_pool import ResourcePool, Slot
from hybridrl.runtime.reuse import PLAIN, StopReport
from hybridrl.runtime.worker import RankSpec, Worker, WorkerHost
from hybridrl.utils.distributed import cpu_share_per_worker, worker_process_env
from hybridrl.utils.secrets import split_secrets

logger = logging.getLogger(__name__)


class RankFailure(Exception):
    """Internal: one rank's call failed. ``died``: the process is gone; otherwise the method raised."""

    def __init__(self, died: bool, detail: str, remote_traceback: str = "",
                 cause: Optional[BaseException] = None) -> None:
        super().__init__(detail)
        self.died, self.detail, self.remote_traceback, self.cause = died, detail, remote_traceback, cause


@dataclass(eq=False)
class Done:
    """A call the serial executor has already run: its value, or the exception it raised."""

    value: Any = None
    error: Optional[BaseException] = None
    remote_traceback: str = ""


def wait_ready(handles: Sequence[Any], timeout_s: float) -> list[Any]:
    """Handles that have finished (at least one unless ``timeout_s`` passes first)."""
    done = [handle for handle in handles if isinstance(handle, Done)]
    if done:
        return done
    ready, _ = ray.wait(list(handles), num_returns=1, timeout=max(timeout_s, 0.0), fetch_local=False)
    return ready


def all_finished(handles: Sequence[Any]) -> bool:
    """Whether every handle has finished; never blocks."""
    refs = [handle for handle in handles if not isinstance(handle, Done)]
    return not refs or len(ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)[0]) == len(refs)


def outcome(handle: Any) -> Any:
    """The finished call's return value, or ``RankFailure``."""
    if isinstance(handle, Done):
        if handle.error is not None:
            raise RankFailure(False, _one_line(handle.error), handle.remote_traceback, handle.error)
        return handle.value
    try:
        return ray.get(handle)
    except ray.exceptions.RayTaskError as error:
        # ray.get raises a subclass of both RayTaskError and the worker's exception type; its text is the worker-side
        # traceback, and ``cause`` the rebuilt original exception.
        cause = error.cause if isinstance(error.cause, BaseException) else None
        remote_traceback = _ANSI_ESCAPE.sub("", str(error))
        detail = _one_line(cause) if cause is not None else remote_traceback.splitlines()[0]
        raise RankFailure(False, detail, remote_traceback, cause) from None
    except (ray.exceptions.RayError, ConnectionError) as error:  # actor died, OOM-killed, node lost, object lost
        raise RankFailure(True, f"{type(error).__name__}: {error}") from None


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class RayExecutor:
    """One Ray actor (a ``WorkerHost``) per rank, each pinned to one bundle of the pool: a process a finished group
    left parked on that bundle (:mod:`hybridrl.runtime.parked`) when one matches, else a new one.

    ``profile``: the engine the group's workers load (``reuse.VLLM`` or ``reuse.PLAIN``): a process that loaded vLLM
    only serves a group that loads it too."""

    def __init__(self, pool: ResourcePool, role: str, bundle_share: float, profile: str = PLAIN) -> None:
        if not 0 < bundle_share <= 1:
            raise ValueError(f"bundle_share must be in (0, 1], got {bundle_share}")
        spec, config = pool.spec, pool.runtime.config
        # Ray's runtime-env agent logs env_vars verbatim: credentials go to the worker as an argument instead.
        process_env = worker_process_env(spec.device, config.worker_env, config.cpu_kernel_cache_capacity)
        env, secret_env = split_secrets(process_env)
        cpu_share = cpu_share_per_worker(spec.device, spec.node_slots or spec.devices_per_node, bundle_share)
        num_cpus, num_gpus = spec.bundle.get("CPU", 0.0) * bundle_share, spec.bundle.get("GPU", 0.0) * bundle_share
        self.keys = [HostKey(slot.placement_group.id.hex(), slot.bundle, num_cpus, num_gpus, tuple(sorted(env.items())),
                             HostKey.secrets_digest(secret_env), cpu_share, config.cpu_keep_freed_memory, profile)
                     for slot in pool.slots()]
        self.actors = []
        for slot, key in zip(pool.slots(), self.keys):
            actor = _parked_host(key)
            if actor is None:
                actor = _remote_host_class().options(
                    num_cpus=num_cpus, num_gpus=num_gpus, scheduling_strategy=_bundle_strategy(slot),
                    runtime_env={"env_vars": env}, max_restarts=0, max_task_retries=0,
                ).remote(f"{role} rank {slot.rank}/{pool.world_size}", cpu_share, secret_env,
                         config.cpu_keep_freed_memory)
            self.actors.append(actor)
        self.role, self.pool, self.parking_limit = role, pool, config.idle_worker_processes
        pool.groups_started += 1

    def submit_locate(self, rank: int) -> Any:
        return self.actors[rank].locate.remote(rank)

    def submit_start(self, spec: RankSpec, worker_cls: type[Worker], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
        return self.actors[spec.rank].start.remote(spec, worker_cls, args, kwargs)

    def submit_execute(self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self.actors[rank].execute.remote(method_name, *args, **kwargs)

    def share(self, value: Any) -> Any:
        """Store ``value`` once in the object store; every rank it is passed to reads the same copy."""
        return ray.put(value)

    def stop(self, graceful_s: float = 0.0, park: bool = False) -> None:
        """End every rank's process. ``graceful_s > 0``: first let each rank close its worker (engines release their
        process groups and shared memory), waiting at most that long — a rank still busy or stuck in a collective is
        then killed all the same; ``0``: kill now. ``park``: the processes of a group whose every rank stopped cleanly
        are parked for the next group instead (:mod:`hybridrl.runtime.parked`)."""
        if not self.actors:
            return
        reports = _close_workers(self.actors, graceful_s) if graceful_s > 0 else None
        parkable = park and reports is not None and all(report.reusable for report in reports)
        if park and reports is not None and not parkable:
            logger.debug("%s: processes not kept for the next group: %s", self.role,
                         "; ".join(report.why_not for report in reports if report.why_not))
        for index, actor in enumerate(self.actors):
            key = replace(self.keys[index], profile=reports[index].profile) if reports else None
            if not (parkable and key is not None and PARKED.park_host(key, actor, self.parking_limit)):
                _kill(actor)
        self.actors = []
        self.pool.groups_started -= 1


def _close_workers(actors: list[Any], graceful_s: float) -> Optional[list[StopReport]]:
    """Each rank's ``stop`` report; ``None`` when one did not answer within ``graceful_s`` or failed."""
    closing = [actor.stop.remote() for actor in actors]
    try:
        ready, _ = ray.wait(closing, num_returns=len(closing), timeout=graceful_s, fetch_local=False)
        return ray.get(closing) if len(ready) == len(closing) else None
    except Exception:  # a rank already gone, or its close raised  # noqa: BLE001
        return None


def _parked_host(key: HostKey) -> Optional[Any]:
    """A live parked process for ``key`` (one that died while parked is dropped), or ``None`` — after ending those
    parked on the bundle that cannot serve it, whose share of the bundle the new process needs."""
    while (actor := PARKED.take_host(key)) is not None:
        try:
            ray.get(actor.ping.remote(), timeout=PING_TIMEOUT_S)
            return actor
        except Exception:  # gone while it waited  # noqa: BLE001
            _kill(actor)
    PARKED.evict_bundle(key.placement_group, key.bundle)
    return None


PING_TIMEOUT_S = 10.0


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone  # noqa: BLE001
        pass


@functools.cache
def _remote_host_class() -> Any:
    return ray.remote(WorkerHost)


def _bundle_strategy(slot: Slot) -> PlacementGroupSchedulingStrategy:
    assert slot.placement_group is not None, "a Ray executor needs a placed pool"
    return PlacementGroupSchedulingStrategy(placement_group=slot.placement_group,
                                            placement_group_bundle_index=slot.bundle,
                                            placement_group_capture_child_tasks=False)


class SerialExecutor:
    """Local mode: every rank's ``WorkerHost`` in this process; calls run at once, in the order submitted."""

    def __init__(self, pool: ResourcePool, role: str, bundle_share: float = 1.0, profile: str = PLAIN) -> None:
        self.hosts = [WorkerHost(f"{role} rank {rank}/{pool.world_size}") for rank in range(pool.world_size)]
        self.role = role

    def submit_locate(self, rank: int) -> Done:
        return _run(lambda: self.hosts[rank].locate(rank))

    def submit_start(self, spec: RankSpec, worker_cls: type[Worker], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Done:
        return _run(lambda: self.hosts[spec.rank].start(spec, worker_cls, args, kwargs))

    def submit_execute(self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Done:
        def call() -> Any:
            call_args, call_kwargs = _copied((args, kwargs))
            return _copied(self.hosts[rank].execute(method_name, *call_args, **call_kwargs))
        return _run(call)

    def share(self, value: Any) -> Any:
        return value  # each call copies its own arguments (see submit_execute)

    def stop(self, graceful_s: float = 0.0, park: bool = False) -> None:
        for host in self.hosts:
            host.stop()


def _run(call: Callable[[], Any]) -> Done:
    try:
        return Done(value=call())
    except Exception as error:  # noqa: BLE001 - reported to the controller as a WorkerError
        return Done(error=error, remote_traceback=traceback.format_exc())


def _copied(value: Any) -> Any:
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


Executor = RayExecutor | SerialExecutor
