"""Resource pools: the devices a set of roles runs on, reserved up front with Ray placement groups.

A pool is ``nnodes × devices_per_node`` bundles — one GPU (plus ``cpus_per_device`` CPUs) each, or
``cpus_per_device`` CPUs each for CPU runs and tests. Each node's share is one ``STRICT_PACK`` placement group, so a
node's ranks sit on one machine (NVLink-local); the per-node groups are placed independently, i.e. packed where there
is room, which on full-sized nodes means one machine each. Ranks are numbered node by node, bundle by bundle.

Roles map to pools by name (``ResourcePoolManager``):

- **colocated**: actor, rollout and reference share one pool *and one process per device* — one worker class that
  composes the three roles (the hybrid engine); one group on the pool.
- **split placement**: e.g. the critic in its own pool; its group never competes with the actor's for a device.

Two groups may also share a pool's bundles as separate processes by each taking a fraction of every bundle
(``WorkerGroup.spawn(..., bundle_share=0.5)``).

Placement never hangs: the request is first checked against the cluster's totals (``requested 8 GPUs, cluster has 4``
fails at once), then waited for at most ``placement_timeout_s``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from hybridrl.runtime.errors import ResourceUnavailableError
from hybridrl.runtime.parked import PARKED, PoolShape
from hybridrl.runtime.ray_runtime import RayRuntime
from hybridrl.runtime.reuse import PLAIN
from hybridrl.utils.distributed import check_device


@dataclass(frozen=True)
class PoolSpec:
    """A pool's size: ``nnodes × devices_per_node`` devices of type ``device`` (``cuda`` or ``cpu``)."""

    name: str
    nnodes: int = 1
    devices_per_node: int = 1
    device: str = "cuda"
    cpus_per_device: float = 1.0
    """CPUs reserved with each device (data loading, tokenisation); the whole bundle for ``device="cpu"``."""
    node_slots: Optional[int] = None
    """CPU pools only: how many device slots of all the pools on a node compute *at the same time*; a worker's
    torch threads are its slot's share of the node's cores (``None``: this pool's ``devices_per_node`` — pools that
    take turns, each using the whole node while it runs)."""
    process_profile: str = PLAIN
    """The engine the pool's first group loads in its processes (``vllm``, or plain): of two parked pools of this
    shape, the one whose processes loaded it is taken (:mod:`hybridrl.runtime.parked`)."""

    def __post_init__(self) -> None:
        check_device(self.device)
        if self.nnodes < 1 or self.devices_per_node < 1:
            raise ValueError(f"pool {self.name!r}: nnodes={self.nnodes} and devices_per_node={self.devices_per_node} "
                             "must be >= 1")
        if self.node_slots is not None and self.node_slots < self.devices_per_node:
            raise ValueError(f"pool {self.name!r}: node_slots={self.node_slots} must count at least its own "
                             f"{self.devices_per_node} device(s)")
        if self.cpus_per_device <= 0 and self.device == "cpu":
            raise ValueError(f"pool {self.name!r}: cpus_per_device must be > 0 for a CPU pool")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    @property
    def bundle(self) -> dict[str, float]:
        if self.device == "cpu":
            return {"CPU": self.cpus_per_device}
        return {"GPU": 1.0, **({"CPU": self.cpus_per_device} if self.cpus_per_device > 0 else {})}


@dataclass(frozen=True)
class Slot:
    """One device of a pool: a bundle of a placement group (``None`` in local mode)."""

    rank: int
    node_index: int
    local_rank: int
    placement_group: Optional[PlacementGroup]
    bundle_index: Optional[int] = None
    """The bundle of ``placement_group`` it is (``None``: ``local_rank``; a :class:`PoolSlice` renumbers ranks)."""

    @property
    def bundle(self) -> int:
        return self.local_rank if self.bundle_index is None else self.bundle_index


class ResourcePool:
    """Reserved devices for one or more worker groups. Create with ``ResourcePool.create``; ``release()`` when done."""

    def __init__(self, spec: PoolSpec, runtime: RayRuntime, placement_groups: Sequence[PlacementGroup]) -> None:
        self.spec, self.runtime = spec, runtime
        self.placement_groups = list(placement_groups)
        self.groups_started = 0
        """Groups started on the pool (or a slice of it) and not yet stopped: a pool released with none keeps its
        reservation for processes parked on it (:mod:`hybridrl.runtime.parked`)."""

    @classmethod
    def create(cls, spec: PoolSpec, runtime: RayRuntime, timeout_s: Optional[float] = None) -> ResourcePool:
        """Reserve the pool's bundles — those of a released pool of the same shape, with the processes parked on
        them, if there is one (:mod:`hybridrl.runtime.parked`); else new ones, freeing the parked reservations when
        they leave no room. Raise ``ResourceUnavailableError`` if that is impossible or takes longer than
        ``timeout_s`` (default ``runtime.config.placement_timeout_s``). In local mode nothing is reserved."""
        if runtime.local_mode:
            return cls(spec, runtime, [])
        parked = PARKED.take_pool(_shape(spec), spec.process_profile)
        if parked is not None:
            return cls(spec, runtime, parked)
        timeout_s = runtime.config.placement_timeout_s if timeout_s is None else timeout_s
        return cls(spec, runtime, _place(spec, timeout_s))

    @property
    def local_mode(self) -> bool:
        return self.runtime.local_mode

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def slots(self) -> list[Slot]:
        """The pool's devices in rank order (node by node)."""
        per_node = self.spec.devices_per_node
        return [Slot(rank, rank // per_node, rank % per_node,
                     self.placement_groups[rank // per_node] if self.placement_groups else None)
                for rank in range(self.world_size)]

    def slice(self, first: int, count: int) -> "PoolSlice":
        """Ranks ``first .. first + count - 1`` of this pool as a pool of their own (see :class:`PoolSlice`)."""
        return PoolSlice(self, first, count)

    def release(self) -> None:
        """Give the devices back (ends any actor still placed in the pool). A pool whose groups all stopped and left
        processes parked on it is parked with them instead, for the next pool of its shape. Idempotent."""
        groups, self.placement_groups = self.placement_groups, []
        if groups and not (self.groups_started == 0 and PARKED.park_pool(_shape(self.spec), groups)):
            PARKED.remove_placement_groups(groups)

    def __repr__(self) -> str:
        spec = self.spec
        where = "local" if self.local_mode else f"{len(self.placement_groups)} placement group(s)"
        return f"ResourcePool({spec.name!r}, {spec.nnodes}x{spec.devices_per_node} {spec.device}, {where})"


class PoolSlice:
    """``count`` consecutive devices of a placed pool, on one node, seen as a pool of ``count`` ranks numbered from 0.

    A group started on it takes a share of those bundles (``bundle_share``) beside the pool's own group: a
    colocated rollout replica's ``t_g`` processes on the devices of actor ranks ``first .. first + t_g - 1``
    (``config/rollout_placement.py``). Its torch threads are counted against the whole node's slots. Releasing is
    the parent pool's business.
    """

    def __init__(self, parent: ResourcePool, first: int, count: int) -> None:
        per_node = parent.spec.devices_per_node
        last = first + count - 1
        if count < 1 or first < 0 or last >= parent.world_size or first // per_node != last // per_node:
            raise ValueError(f"pool {parent.spec.name!r}: ranks {first}..{last} are not {count} "
                             f"device(s) of one node ({parent.spec.nnodes} × {per_node})")
        self.parent, self.first, self.runtime = parent, first, parent.runtime
        self.spec = replace(parent.spec, name=f"{parent.spec.name}[{first}:{first + count}]", nnodes=1,
                            devices_per_node=count, node_slots=parent.spec.node_slots or per_node)

    @property
    def local_mode(self) -> bool:
        return self.parent.local_mode

    @property
    def groups_started(self) -> int:
        return self.parent.groups_started

    @groups_started.setter
    def groups_started(self, count: int) -> None:
        self.parent.groups_started = count

    @property
    def world_size(self) -> int:
        return self.spec.devices_per_node

    def slots(self) -> list[Slot]:
        """The slice's devices as ranks ``0 .. count - 1``, each still naming its bundle of the parent's group."""
        chosen = self.parent.slots()[self.first:self.first + self.world_size]
        return [Slot(rank, 0, rank, slot.placement_group, bundle_index=slot.bundle)
                for rank, slot in enumerate(chosen)]

    def __repr__(self) -> str:
        return f"PoolSlice({self.spec.name!r} of {self.parent!r})"


class ResourcePoolManager:
    """Maps roles to pools: roles naming the same pool are colocated on its devices."""

    def __init__(self, specs: Sequence[PoolSpec], role_to_pool: Mapping[str, str]) -> None:
        self.specs = {spec.name: spec for spec in specs}
        if len(self.specs) != len(specs):
            raise ValueError(f"pool names must be unique, got {[spec.name for spec in specs]}")
        for role, pool_name in role_to_pool.items():
            if pool_name not in self.specs:
                raise ValueError(f"role {role!r} maps to pool {pool_name!r}, which is not one of {sorted(self.specs)}")
        self.role_to_pool = dict(role_to_pool)
        self.pools: dict[str, ResourcePool] = {}

    def create(self, runtime: RayRuntime, timeout_s: Optional[float] = None) -> None:
        """Reserve every pool; if one cannot be placed, release those already reserved and re-raise. Pools that
        together ask for more than the cluster has are refused before any is placed (not after the placement
        timeout of the one that finds no room)."""
        if not runtime.local_mode:
            _check_joint_capacity(list(self.specs.values()))
        try:
            for name, spec in self.specs.items():
                self.pools[name] = ResourcePool.create(spec, runtime, timeout_s)
        except BaseException:
            self.release()
            raise

    def pool_for(self, role: str) -> ResourcePool:
        if role not in self.role_to_pool:
            raise KeyError(f"role {role!r} has no pool; known roles: {sorted(self.role_to_pool)}")
        name = self.role_to_pool[role]
        if name not in self.pools:
            raise RuntimeError(f"pool {name!r} is not created yet; call ResourcePoolManager.create(runtime) first")
        return self.pools[name]

    def roles_in(self, pool_name: str) -> list[str]:
        """The roles that run on ``pool_name`` (colocated: each takes a share of every bundle)."""
        return [role for role, name in self.role_to_pool.items() if name == pool_name]

    def release(self) -> None:
        for pool in self.pools.values():
            pool.release()
        self.pools = {}


def _shape(spec: PoolSpec) -> PoolShape:
    return PoolShape(spec.nnodes, spec.devices_per_node, spec.device, spec.cpus_per_device)


def _place(spec: PoolSpec, timeout_s: float) -> list[PlacementGroup]:
    _check_capacity(spec)
    groups = [placement_group([dict(spec.bundle)] * spec.devices_per_node, strategy="STRICT_PACK",
                              name=f"hybridrl:{spec.name}:node{node}:{next(_placements)}")
              for node in range(spec.nnodes)]
    waits = [group.ready() for group in groups]
    started = time.monotonic()
    if PARKED.pools_parked:  # room is often there beside them; when it is not, the parked reservations make it
        ready, _ = ray.wait(waits, num_returns=len(groups), timeout=min(PARKED_ROOM_WAIT_S, timeout_s))
        if len(ready) < len(groups):
            PARKED.release_pools()
    ready, _ = ray.wait(waits, num_returns=len(groups), timeout=max(timeout_s - (time.monotonic() - started), 0.0))
    if len(ready) < len(groups):
        for group in groups:
            remove_placement_group(group)
        raise ResourceUnavailableError(
            f"resource pool {spec.name!r} could not be placed within {timeout_s:g} s: {_demand(spec)}; "
            f"cluster has {_cluster_total(spec)} in total, {_available(spec)} free now "
            "(other pools or actors hold the rest, or no node has room for one node's share)")
    return groups


_placements = itertools.count()
"""Numbers the placement groups this controller makes: Ray names must be unique, and a parked pool keeps its name
while a new pool of the same name is placed beside it."""

PARKED_ROOM_WAIT_S = 1.0
"""How long a new pool waits for room beside the parked reservations before they are freed for it."""


def _check_capacity(spec: PoolSpec) -> None:
    """Fail at once when the cluster can never hold the pool (no waiting for resources that do not exist)."""
    key, per_bundle = _resource_key(spec)
    total = _cluster_total(spec)
    if total < spec.world_size * per_bundle:
        raise ResourceUnavailableError(f"resource pool {spec.name!r}: {_demand(spec)}, cluster has {_fmt(total)} "
                                       f"{_unit(key)}")
    largest = max((node["Resources"].get(key, 0.0) for node in ray.nodes() if node.get("Alive")), default=0.0)
    if largest < spec.devices_per_node * per_bundle:
        raise ResourceUnavailableError(
            f"resource pool {spec.name!r}: requested {_fmt(spec.devices_per_node * per_bundle)} {_unit(key)} on one "
            f"node, the largest node has {_fmt(largest)}")


def _check_joint_capacity(specs: Sequence[PoolSpec]) -> None:
    """Fail at once when the pools together need more of a resource than the whole cluster has."""
    for key in ("CPU", "GPU"):
        asking = [spec for spec in specs if _resource_key(spec)[0] == key]
        wanted = sum(spec.world_size * _resource_key(spec)[1] for spec in asking)
        if len(asking) < 2 or not wanted:
            continue  # one pool alone is checked, with its own message, when it is placed
        total = float(ray.cluster_resources().get(key, 0.0))
        if total < wanted:
            parts = " + ".join(f"{spec.name!r} {_fmt(spec.world_size * _resource_key(spec)[1])}" for spec in asking)
            raise ResourceUnavailableError(f"resource pools {parts} request {_fmt(wanted)} {_unit(key)} together, "
                                           f"cluster has {_fmt(total)} {_unit(key)}")


def _resource_key(spec: PoolSpec) -> tuple[str, float]:
    return ("CPU", spec.cpus_per_device) if spec.device == "cpu" else ("GPU", 1.0)


def _demand(spec: PoolSpec) -> str:
    key, per_bundle = _resource_key(spec)
    return (f"requested {_fmt(spec.world_size * per_bundle)} {_unit(key)} "
            f"({spec.nnodes} node(s) x {spec.devices_per_node} device(s))")


def _cluster_total(spec: PoolSpec) -> float:
    return float(ray.cluster_resources().get(_resource_key(spec)[0], 0.0))


def _available(spec: PoolSpec) -> str:
    return _fmt(float(ray.available_resources().get(_resource_key(spec)[0], 0.0)))


def _unit(key: str) -> str:
    return "GPUs" if key == "GPU" else "CPUs"


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
