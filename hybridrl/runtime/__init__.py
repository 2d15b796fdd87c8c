"""The single controller: Ray start-up, resource pools, worker groups and declared dispatch.

A controller defines workers, reserves devices, starts groups and calls them like ordinary Python::

    from hybridrl.runtime import Worker, WorkerGroup, ResourcePool, PoolSpec, dp_split, start_ray

    class Scorer(Worker):
        @dp_split
        def score(self, batch: Batch) -> Batch: ...

    with start_ray(config.trainer.ray) as runtime:
        pool = ResourcePool.create(PoolSpec("global", nnodes=1, devices_per_node=2, device="cpu"), runtime)
        scorer = WorkerGroup(Scorer, pool, name="scorer")
        scored = scorer.call(Scorer.score, batch)          # typed Batch; "go to definition" lands on Scorer.score

``ray_runtime`` is imported first: it sets Ray's environment defaults before anything imports ``ray``.
"""

from hybridrl.runtime.ray_runtime import RayRuntime, start_ray  # noqa: I001 (must come first, see above)
from hybridrl.runtime.dispatch import (Dispatch, DispatchedMethod, dp_leaders, dp_split, one_to_all,
                                          rank_zero)
from hybridrl.runtime.errors import (RankLocation, ResourceUnavailableError, WorkerDiedError, WorkerError,
                                        WorkerGroupStoppedError, WorkerTimeoutError)
from hybridrl.runtime.parked import release_parked_workers
from hybridrl.runtime.resource_pool import PoolSpec, ResourcePool, ResourcePoolManager
from hybridrl.runtime.worker import Worker, WorkerContext
from hybridrl.runtime.worker_group import GroupFuture, WorkerGroup, gather

__all__ = [
    "Dispatch", "DispatchedMethod", "GroupFuture", "PoolSpec", "RankLocation", "RayRuntime", "ResourcePool",
    "ResourcePoolManager", "ResourceUnavailableError", "Worker", "WorkerContext", "WorkerDiedError", "WorkerError",
    "WorkerGroup", "WorkerGroupStoppedError", "WorkerTimeoutError", "dp_leaders", "dp_split", "gather",
    "one_to_all", "rank_zero", "release_parked_workers", "start_ray",
]
