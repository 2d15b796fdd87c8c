"""A worker group that shuts down cleanly leaves its processes, and its pool's reservation, to the next group of the
same shape (``hybridrl.runtime.parked``) — and only then: a failed group's processes, a process that kept a thread
running, and a process that loaded an engine (for a group that does not) are never handed on; released processes
end; no more wait than ``trainer.ray.idle_worker_processes``. A real vLLM engine rebuilt in a parked process:
``test_actor_worker.py``.

Each test reserves bundles of a CPU share no other test uses (``cpus_per_device``), so the parked processes it sees
are its own; most use one-rank groups, which is all parking needs."""

from __future__ import annotations

import pytest
from distributed_helpers import ray_config
from sample_workers import EchoWorker, EngineLoadingWorker

from hybridrl.runtime import PoolSpec, ResourcePool, WorkerError, WorkerGroup, release_parked_workers, start_ray

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


def start(runtime, share: float, worker=EchoWorker, ranks: int = 1,
          profile: str = "") -> tuple[ResourcePool, WorkerGroup, list[int]]:
    pool = ResourcePool.create(PoolSpec(f"parked{share}", devices_per_node=ranks, device="cpu",
                                        cpus_per_device=share, process_profile=profile), runtime)
    group = WorkerGroup(worker, pool, name=f"{worker.__name__}{share}", args=(1.0,))
    return pool, group, group.call(worker.pid)


def finish(pool: ResourcePool, group: WorkerGroup) -> None:
    group.shutdown()
    pool.release()


def test_the_next_group_starts_in_the_processes_a_clean_one_left_until_they_are_released(ray_runtime):
    pool, group, first = start(ray_runtime, 0.25, ranks=2)
    group.call(EchoWorker.set_env, "LEFT_BY_THE_FIRST", "1")
    reserved = [placement.id for placement in pool.placement_groups]
    finish(pool, group)
    pool, group, second = start(ray_runtime, 0.25, ranks=2)
    try:
        assert second == first and [placement.id for placement in pool.placement_groups] == reserved
        assert group.call(EchoWorker.all_reduce_sum, 1.0) == 3.0  # a new process group: 1·1 + 1·2
        assert [info["rank"] for info in group.call(EchoWorker.rank_info)] == [0, 1]
        assert group.call(EchoWorker.get_env, "LEFT_BY_THE_FIRST") == [None, None]  # the environment was put back
    finally:
        finish(pool, group)
    release_parked_workers()
    bound_one = start_ray(ray_config(idle_worker_processes=1))  # the running Ray, with another bound
    pool, group, third = start(bound_one, 0.25, ranks=2)
    finish(pool, group)
    pool, group, fourth = start(bound_one, 0.25, ranks=2)
    finish(pool, group)
    release_parked_workers()
    assert set(third).isdisjoint(first)  # released: they had ended
    assert len(set(fourth) & set(third)) == 1  # no more than the bound waited: the newest process


def test_a_spoilt_group_leaves_no_process_to_the_next(ray_runtime):
    pool, group, raised = start(ray_runtime, 0.125)
    with pytest.raises(WorkerError, match="bad input seen by rank 0"):
        group.call(EchoWorker.raise_on, 0)
    finish(pool, group)
    pool, group, threaded = start(ray_runtime, 0.125)
    group.call(EchoWorker.start_thread, 60.0)
    finish(pool, group)
    pool, group, last = start(ray_runtime, 0.125)
    finish(pool, group)
    release_parked_workers()
    assert len(set(raised + threaded + last)) == 3


def test_a_process_that_loaded_an_engine_serves_only_groups_that_load_it_and_reservations_wait_side_by_side(
        ray_runtime):
    """A plain group never takes a process that loaded an engine: its pool is placed beside the engine's parked one
    (so is a pool of another shape), and each later pool takes the parked one its first group's profile names. A
    plain process may go on to load an engine; a plain rank sent among engine processes ends the one on its
    bundle."""
    pool, group, loaded = start(ray_runtime, 0.0625, EngineLoadingWorker, profile="vllm")
    finish(pool, group)
    pool, group, plain = start(ray_runtime, 0.0625)
    finish(pool, group)
    pool, group, other_shape = start(ray_runtime, 0.0625, ranks=2)
    finish(pool, group)
    pool, group, loaded_again = start(ray_runtime, 0.0625, EngineLoadingWorker, profile="vllm")
    finish(pool, group)
    pool, group, plain_again = start(ray_runtime, 0.0625)
    finish(pool, group)
    pool, group, plain_loads = start(ray_runtime, 0.0625, EngineLoadingWorker)  # the plain pool, named by its hint
    finish(pool, group)
    pool, group, fresh = start(ray_runtime, 0.0625, profile="vllm")  # a plain rank among engine processes
    finish(pool, group)
    release_parked_workers()
    assert plain != loaded and set(other_shape).isdisjoint(loaded + plain)
    assert loaded_again == loaded and plain_again == plain
    assert plain_loads == plain  # a plain process may go on to load an engine
    assert fresh != plain and fresh != loaded


def test_a_ray_started_again_takes_nothing_parked_in_the_one_before(ray_runtime):
    """A notebook or a suite that stops Ray itself (``ray.shutdown()``) and starts it again: the new instance numbers
    its jobs from 1 again, so the job id alone took the old instance's reservation, and the group waited for
    placement groups that no longer existed until its start-up timed out."""
    import ray

    from shared_ray import shared_ray_runtime

    pool, group, before = start(ray_runtime, 0.03125)
    finish(pool, group)
    ray.shutdown()
    pool, group, after = start(shared_ray_runtime(), 0.03125)
    try:
        assert group.call(EchoWorker.all_reduce_sum, 1.0) == 1.0 and after != before
    finally:
        finish(pool, group)
