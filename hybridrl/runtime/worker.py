"""The worker side: the ``Worker`` base class that role workers subclass, and the host that runs one rank of a group.

A role worker is an ordinary class with dispatch-decorated methods::

    class Critic(Worker):
        def __init__(self, config: CriticConfig) -> None:
            self.model = build_value_model(config, mesh=self.dp_mesh)   # context is ready before __init__ runs

        @dp_split
        def compute_values(self, batch: Batch) -> Batch: ...

Several roles in one process (the hybrid engine) are one worker class that *composes* role objects sharing one
model, and exposes each role's operations as its own dispatch-decorated methods (see ``tests/distributed`` for a
complete actor + rollout + reference example). There is no run-time fusion of classes: every method the controller
calls is written out, so "go to definition" lands on it.

``WorkerHost`` owns one rank: it joins the process group, builds the device meshes, constructs the worker and runs
the methods the controller asks for. In a Ray group it *is* the actor; in local mode the controller process holds one
host per rank and calls them in turn.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch.distributed.device_mesh import DeviceMesh

from hybridrl.runtime import reuse
from hybridrl.runtime.errors import RankLocation
from hybridrl.protocol import Batch
from hybridrl.utils import cpu_malloc
from hybridrl.utils import distributed as dist_utils
from hybridrl.utils.collectives import CollectiveCounter


@dataclass(frozen=True)
class RankSpec:
    """Everything one rank needs to start, decided by the controller."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: str
    tp_size: int
    timeout_s: float
    master_addr: Optional[str] = None
    """``None``: no multi-process group (local mode); world size 1 then still gets a one-rank group."""
    master_port: int = 0


@dataclass(frozen=True)
class WorkerContext:
    """A worker's place in its group. ``dp_mesh`` is 1-D ``("dp",)`` over all ranks (FSDP shards over it);
    ``rollout_mesh`` is ``("dp", "tp")`` of shape ``[world_size // tp_size, tp_size]``. Both are ``None`` only in
    local mode with several ranks, where no process group exists (collectives are then unavailable)."""

    role: str
    rank: int
    world_size: int
    local_rank: int
    device: str
    tp_size: int
    dp_mesh: Optional[DeviceMesh]
    rollout_mesh: Optional[DeviceMesh]

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel replica in the rollout ``[dp, tp]`` layout."""
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        """This rank's position inside its tensor-parallel group in the rollout layout."""
        return self.rank % self.tp_size


class Worker:
    """Base class of role workers. The context (rank, world size, meshes) is set before the subclass's ``__init__``
    runs, so a subclass may use ``self.dp_mesh`` in its constructor; calling ``super().__init__()`` is optional."""

    _hybridrl_context: WorkerContext

    @property
    def context(self) -> WorkerContext:
        return self._hybridrl_context

    @classmethod
    def process_profile(cls, *args: Any, **kwargs: Any) -> str:
        """The engine a worker built from these arguments loads into its process (``reuse.VLLM``), or ``reuse.PLAIN``:
        a process that loaded vLLM is only handed to workers that load it too (:mod:`hybridrl.runtime.parked`)."""
        return reuse.PLAIN

    @property
    def rank(self) -> int:
        return self._hybridrl_context.rank

    @property
    def world_size(self) -> int:
        return self._hybridrl_context.world_size

    @property
    def device(self) -> torch.device:
        """``cuda`` (the GPU Ray assigned to this process) or ``cpu``."""
        return torch.device("cuda", 0) if self._hybridrl_context.device == "cuda" else torch.device("cpu")

    @property
    def dp_mesh(self) -> Optional[DeviceMesh]:
        return self._hybridrl_context.dp_mesh

    @property
    def rollout_mesh(self) -> Optional[DeviceMesh]:
        return self._hybridrl_context.rollout_mesh


@dataclass(frozen=True)
class TimedResult:
    """What ``WorkerHost.execute`` sends back: the method's return value and the seconds the method ran inside the
    worker (argument placement on the device included; Ray's (de)serialisation and transfer excluded). The group's
    future unwraps it; the controller's wall time for the call minus ``seconds`` is the dispatch overhead."""

    value: Any
    seconds: float
    payload_bytes: dict = field(default_factory=dict)
    """The bytes of the collectives the method issued on this rank, by kind
    (:class:`~hybridrl.utils.collectives.CollectiveCounter`)."""


# The serial executor's world-size-1 groups share this process's one default process group.
_local_group_users = 0
_local_group_owned = False


class WorkerHost:
    """One rank of a worker group: process set-up, the worker object, and method execution. A host whose worker was
    stopped cleanly may start another group's worker (:mod:`hybridrl.runtime.parked`)."""

    def __init__(self, label: str = "", cpu_share: Optional[float] = None,
                 secret_env: Optional[dict[str, str]] = None, keep_freed_memory: bool = False) -> None:
        os.environ.update(secret_env or {})  # credentials from trainer.ray.worker_env (kept out of Ray's runtime_env)
        if cpu_share is not None:  # a CPU worker: its share of this node's cores (dist_utils.cpu_share_per_worker)
            torch.set_num_threads(dist_utils.threads_for_cpu_share(cpu_share))
            if keep_freed_memory:  # trainer.ray.cpu_keep_freed_memory
                cpu_malloc.keep_freed_memory()
        self._label = label
        self._worker: Optional[Worker] = None
        self._spec: Optional[RankSpec] = None
        self._fresh = reuse.ProcessState.now()

    def locate(self, rank: int) -> tuple[RankLocation, int]:
        """Where this rank runs, and a port free on its node (used as ``MASTER_PORT`` when this is rank 0)."""
        import ray

        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        return RankLocation(rank, dist_utils.node_address(), node_id, os.getpid()), dist_utils.find_free_port()

    def start(self, spec: RankSpec, worker_cls: type[Worker], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Join the process group, build the meshes, then construct ``worker_cls(*args, **kwargs)`` with its context."""
        dist_utils.check_tp_size(spec.world_size, spec.tp_size)
        if self._worker is not None:
            raise RuntimeError(f"{self._label}: a worker is running here already")
        self._spec, self._label = spec, f"{spec.role} rank {spec.rank}/{spec.world_size}"
        meshes: tuple[Optional[DeviceMesh], Optional[DeviceMesh]] = (None, None)
        if spec.master_addr is not None:
            env = dist_utils.rank_env(spec.rank, spec.world_size, spec.local_rank, spec.local_world_size,
                                      spec.master_addr, spec.master_port)
            dist_utils.init_process_group(spec.device, env, spec.timeout_s)
            meshes = dist_utils.build_device_meshes(spec.device, spec.world_size, spec.tp_size)
        elif spec.world_size == 1:
            _acquire_local_group(spec.device)
            meshes = dist_utils.build_device_meshes(spec.device, 1, 1)
        context = WorkerContext(spec.role, spec.rank, spec.world_size, spec.local_rank, spec.device, spec.tp_size,
                                *meshes)
        worker = worker_cls.__new__(worker_cls)
        worker._hybridrl_context = context
        worker.__init__(*args, **kwargs)  # type: ignore[misc]
        self._worker = worker

    def execute(self, method_name: str, /, *args: Any, **kwargs: Any) -> TimedResult:
        """Run ``worker.<method_name>(*args, **kwargs)``; the name comes from a ``DispatchedMethod``."""
        started = time.perf_counter()
        if self._worker is None:
            raise RuntimeError(f"{method_name}() called before the worker was constructed")
        # Batches travel on CPU (pickled through Ray); each rank works on its own device and returns CPU results.
        device = self._worker.device
        args = tuple(arg.to(device) if isinstance(arg, Batch) else arg for arg in args)
        kwargs = {key: value.to(device) if isinstance(value, Batch) else value for key, value in kwargs.items()}
        with CollectiveCounter() as comm:
            result = getattr(self._worker, method_name)(*args, **kwargs)
        result = result.cpu() if isinstance(result, Batch) and device.type != "cpu" else result
        return TimedResult(result, time.perf_counter() - started, dict(comm.payload_bytes))

    def __repr__(self) -> str:  # Ray shows this in log prefixes and errors: "(critic rank 1/2 pid=...)"
        return self._label or "WorkerHost"

    def ping(self) -> int:
        """This process's id: a parked host answers before it is given a rank."""
        return os.getpid()

    def stop(self) -> reuse.StopReport:
        """Close the worker (its optional ``close()``: engines holding process groups of their own release them
        first), leave the process group, and say whether the process can serve another group: its worker dropped,
        nothing it started still running, its process-wide settings as they were (:mod:`reuse`)."""
        spec, worker, self._worker, self._spec = self._spec, self._worker, None, None
        close = getattr(worker, "close", None)
        if callable(close):
            close()
        if spec is not None and spec.master_addr is not None:
            dist_utils.leave_process_group()
        elif spec is not None and spec.master_addr is None and spec.world_size == 1:
            _release_local_group()
        del worker, close
        return reuse.settle(self._fresh)


def _acquire_local_group(device: str) -> None:
    global _local_group_users, _local_group_owned
    if _local_group_users == 0:
        _local_group_owned = dist_utils.init_single_rank_group(device)
    _local_group_users += 1


def _release_local_group() -> None:
    global _local_group_users, _local_group_owned
    _local_group_users -= 1
    if _local_group_users == 0 and _local_group_owned:
        dist_utils.leave_process_group()
        _local_group_owned = False
