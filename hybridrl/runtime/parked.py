"""Worker processes parked for the next group, with the reservation they sit on.

Starting a rank costs a process and its imports — torch, transformers, hybridrl, and vLLM for an engine: about 4 of a
2-rank group's 5.5 s on the 2-core box, and 8 of a vLLM group's 10 s (the engine itself is 0.3 s once vLLM is
imported). A group that shuts down cleanly therefore leaves its ranks' processes parked on their placement-group
bundles, its pool's reservation parked with them, and the next pool of the same shape and the next group on its
bundles take them instead of starting new ones: a training run after another in one Ray (a notebook, ``hybridrl
demo``'s SFT then GRPO, a test suite) starts in the processes the first left behind.

What a process carries from one group to the next is bounded by the host (``WorkerHost.stop``): its worker is closed
and dropped, its process group left, its environment put back; a process with a thread or a child process still
running, or that any check finds changed, is ended instead. A host remembers the engine it loaded (its *profile*):
vLLM changes process-wide state when it loads, so a process that loaded it only serves groups that load it too.

Reservations of several shapes wait side by side (a run with a rollout pool beside its actor's, then a colocated
one): a new pool takes a parked one of its shape whose processes its first group can use — those that loaded the
engine it loads (``PoolSpec.process_profile``) first, then plain ones — and is otherwise placed beside them, freeing
them only when they leave it no room. A reservation the bound left without processes is freed.

``trainer.ray.idle_worker_processes`` bounds how many processes wait (0: none, every group's processes end with it);
Ray's shutdown ends them, and :func:`release_parked_workers` ends them at once (a notebook handing the devices to
something else). A restart after a lost worker starts every group in fresh processes.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from hybridrl.runtime.reuse import PLAIN

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostKey:
    """What a parked process must match to serve a new rank: the same bundle, the same share of it, the same
    environment and start-up arguments, and a profile the new rank's worker accepts."""

    placement_group: str
    bundle: int
    num_cpus: float
    num_gpus: float
    env: tuple[tuple[str, str], ...]
    secrets: str
    """A digest of the credentials the process was given (never the values)."""
    cpu_share: Optional[float]
    keep_freed_memory: bool
    profile: str = PLAIN

    @staticmethod
    def secrets_digest(secret_env: dict[str, str]) -> str:
        return hashlib.sha256(repr(sorted(secret_env.items())).encode()).hexdigest()


@dataclass(frozen=True)
class PoolShape:
    """The part of a pool's spec its placement groups fix (a name or ``node_slots`` do not)."""

    nnodes: int
    devices_per_node: int
    device: str
    cpus_per_device: float


@dataclass
class _ParkedPool:
    shape: PoolShape
    placement_groups: list[PlacementGroup]


class ParkedWorkers:
    """This controller's parked processes and reservations (one per process: :data:`PARKED`)."""

    def __init__(self) -> None:
        self._hosts: dict[HostKey, list[Any]] = {}
        self._order: list[tuple[HostKey, Any]] = []  # oldest first, for the bound
        self._pools: list[_ParkedPool] = []
        self._ray: Optional[tuple[str, str]] = None

    # -- processes ---------------------------------------------------------------------------------------------------
    def take_host(self, key: HostKey) -> Optional[Any]:
        """A parked process for ``key`` (its profile, or a plain one for a rank that will load an engine), or
        ``None``. The caller checks it is alive."""
        self._forget_if_ray_changed()
        for profile in dict.fromkeys((key.profile, PLAIN)):
            hosts = self._hosts.get(replace(key, profile=profile))
            if hosts:
                actor = hosts.pop()
                self._order = [(k, a) for k, a in self._order if a is not actor]
                return actor
        return None

    def park_host(self, key: HostKey, actor: Any, limit: int) -> bool:
        """Keep ``actor`` for a later rank matching ``key``; the oldest parked process ends when more than ``limit``
        wait. ``False``: ``limit`` is 0, nothing was kept (the caller ends the process)."""
        if limit <= 0:
            return False
        self._forget_if_ray_changed()
        self._ray = self._ray or _current_ray()
        self._hosts.setdefault(key, []).append(actor)
        self._order.append((key, actor))
        while len(self._order) > limit:
            old_key, old = self._order.pop(0)
            self._hosts[old_key].remove(old)
            _kill(old)
        self._drop_empty_pools()
        return True

    def evict_bundle(self, placement_group: str, bundle: int) -> None:
        """End the processes parked on one bundle: a new rank there that none of them can serve needs its room (a
        parked process holds its share of the bundle's CPUs or GPU)."""
        evicted = [(key, actor) for key, actor in self._order
                   if key.placement_group == placement_group and key.bundle == bundle]
        for key, actor in evicted:
            self._hosts[key].remove(actor)
            _kill(actor)
        self._order = [(key, actor) for key, actor in self._order if (key, actor) not in evicted]

    def _drop_empty_pools(self) -> None:
        """Free the parked reservations no parked process sits on any more (the bound ended the last of them)."""
        empty = [pool for pool in self._pools if not self.hosts_on(pool.placement_groups)]
        self._pools = [pool for pool in self._pools if pool not in empty]
        for pool in empty:
            for group in pool.placement_groups:
                remove_placement_group(group)

    def hosts_on(self, placement_groups: Sequence[PlacementGroup], profile: Optional[str] = None) -> int:
        """How many processes are parked on ``placement_groups`` (of ``profile`` only, when given)."""
        ids = {group.id.hex() for group in placement_groups}
        return sum(1 for key, _ in self._order
                   if key.placement_group in ids and (profile is None or key.profile == profile))

    # -- reservations ------------------------------------------------------------------------------------------------
    def take_pool(self, shape: PoolShape, profile: str = PLAIN) -> Optional[list[PlacementGroup]]:
        """The placement groups of a parked pool of ``shape`` with a process the pool's first group can use (one of
        ``profile``, the engine it loads, or a plain one), or ``None``: of several, the one with the most processes
        of ``profile``, then of plain ones, then the newest. A pool of processes only another engine's groups can
        use stays parked for them."""
        self._forget_if_ray_changed()
        counted = [(self.hosts_on(pool.placement_groups, profile), self.hosts_on(pool.placement_groups, PLAIN), index)
                   for index, pool in enumerate(self._pools) if pool.shape == shape]
        usable = [count for count in counted if count[0] or count[1]]
        if not usable:
            return None
        return self._pools.pop(max(usable)[2]).placement_groups

    def park_pool(self, shape: PoolShape, placement_groups: list[PlacementGroup]) -> bool:
        """Keep a released pool's reservation while processes are parked on it; ``False``: none are (the caller
        removes the placement groups)."""
        if not self.hosts_on(placement_groups):
            return False
        self._pools.append(_ParkedPool(shape, list(placement_groups)))
        return True

    @property
    def pools_parked(self) -> int:
        return len(self._pools)

    def release_pools(self) -> None:
        """Remove every parked reservation (and so the processes parked on it): a new pool needs the room."""
        pools, self._pools = self._pools, []
        for pool in pools:
            self.remove_placement_groups(pool.placement_groups)

    def remove_placement_groups(self, placement_groups: Sequence[PlacementGroup]) -> None:
        """Remove ``placement_groups`` and forget the processes parked on them (Ray ends those with them)."""
        ids = {group.id.hex() for group in placement_groups}
        for key in [key for key in self._hosts if key.placement_group in ids]:
            del self._hosts[key]
        self._order = [(key, actor) for key, actor in self._order if key.placement_group not in ids]
        for group in placement_groups:
            remove_placement_group(group)

    def release(self) -> None:
        """End every parked process and free every parked reservation."""
        self.release_pools()
        order, self._order, self._hosts = self._order, [], {}
        for _, actor in order:
            _kill(actor)

    def forget(self) -> None:
        """Drop every reference without touching Ray (it is shutting down and ends them itself)."""
        self._hosts, self._order, self._pools, self._ray = {}, [], [], None

    def __len__(self) -> int:
        return len(self._order)

    def _forget_if_ray_changed(self) -> None:
        """Entries from an earlier Ray instance (stopped and started again in this process, or another cluster
        joined) are gone with it."""
        if self._ray is not None and (not ray.is_initialized() or _current_ray() != self._ray):
            self.forget()


def _current_ray() -> tuple[str, str]:
    """This process's Ray connection: its job and the node it runs on. The job id alone repeats (each new instance
    numbers its jobs from 1); a node id is new every time a node starts."""
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone  # noqa: BLE001
        pass


PARKED = ParkedWorkers()


def release_parked_workers() -> None:
    """End the worker processes that finished groups left parked, and free their reservations (see the module
    docstring); the next group starts fresh processes."""
    if ray.is_initialized():
        PARKED.release()
    else:
        PARKED.forget()
