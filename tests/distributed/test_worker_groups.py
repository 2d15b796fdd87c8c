"""Worker groups on real Ray with CPU bundles and real gloo groups: every dispatch mode, collectives, async calls,
colocated roles, split placement, the serial executor, and placement errors. One Ray instance for the module."""

from __future__ import annotations

import time

import pytest
import torch
from distributed_helpers import cpu_pool, ray_config
from sample_workers import ActorRolloutRefWorker, EchoWorker, ValueWorker, make_batch

from hybridrl.runtime import (PoolSpec, ResourcePool, ResourceUnavailableError, WorkerError, WorkerGroup, gather,
                                 start_ray)
from hybridrl.protocol import Batch

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def echo2(ray_runtime):
    pool = cpu_pool(ray_runtime, "echo2", 2)
    group = WorkerGroup(EchoWorker, pool, name="echo2", args=(1.0,))
    yield group
    group.shutdown()
    pool.release()


@pytest.fixture(scope="module")
def echo4(ray_runtime):
    pool = cpu_pool(ray_runtime, "echo4", 4)
    group = WorkerGroup(EchoWorker, pool, name="echo4", args=(1.0,), tp_size=2)
    yield group
    group.shutdown()
    pool.release()


@pytest.fixture(scope="module", params=["echo2", "echo4"])
def echo(request):
    return request.getfixturevalue(request.param)


def test_ranks_meshes_and_threads(echo4):
    infos = echo4.call(EchoWorker.rank_info)
    assert [info["rank"] for info in infos] == [0, 1, 2, 3]
    assert [(info["dp_rank"], info["tp_rank"]) for info in infos] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {info["world_size"] for info in infos} == {4} and {info["pg_world"] for info in infos} == {4}
    assert {info["threads"] for info in infos} == {1}
    assert len({info["pid"] for info in infos}) == 4
    shapes = echo4.call(EchoWorker.mesh_shapes)
    assert all(s["dp"] == [4] and s["rollout"] == [2, 2] for s in shapes)
    assert [s["tp_peers"] for s in shapes] == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_all_reduce_through_gloo(echo):
    # rank r contributes 2.5 * (r + 1): the sum is 2.5 * n(n+1)/2
    n = echo.world_size
    assert echo.call(EchoWorker.all_reduce_sum, 2.5) == pytest.approx(2.5 * n * (n + 1) / 2)


@pytest.mark.parametrize("rows", [8, 7, 3])
def test_dp_split_round_trip(echo, rows):
    batch = make_batch(rows)
    out = echo.call(EchoWorker.add_offset, batch, scale=2.0)
    assert isinstance(out, Batch) and len(out) == rows
    assert torch.equal(out["y"], batch["x"] * 2.0 + 1.0)
    assert torch.equal(out["ids"], batch["ids"]) and list(out["tag"]) == list(batch["tag"])
    per_rank = -(-rows // echo.world_size)
    assert out["rank"].tolist() == [i // per_rank for i in range(rows)]  # contiguous shards, in rank order


def test_dp_split_without_padding(echo2):
    assert echo2.call(EchoWorker.count_rows, make_batch(8)) == [4, 4]
    with pytest.raises(ValueError, match="divisible"):
        echo2.call(EchoWorker.count_rows, make_batch(7))


def test_dp_leaders_round_trip(echo4):
    batch = make_batch(5)
    out = echo4.call(EchoWorker.leader_echo, batch)
    assert torch.equal(out["ids"], batch["ids"])
    assert set(out["rank"].tolist()) == {0, 2}  # only tp_rank 0 outputs are gathered
    seen = echo4.call(EchoWorker.seen_rows)
    assert seen[0] == seen[1] == [0, 1, 2] and seen[2] == seen[3] == [3, 4, 0]  # TP peers share a (padded) chunk


def test_rank_zero_and_one_to_all(echo4):
    assert echo4.call(EchoWorker.whoami, "hello") == ("hello", 0)
    assert echo4.call(EchoWorker.sleep, 0.0) == [0.0] * 4


def test_async_calls_on_two_groups_run_concurrently(echo2, echo4):
    slow2 = echo2.call_async(EchoWorker.sleep_span, 1.0)
    slow4 = echo4.call_async(EchoWorker.sleep_span, 1.0)
    assert not slow2.done()
    first, second = gather(slow2, slow4)
    spans = first + second
    assert len(spans) == 6
    # Both ran at once, not one after the other: every rank of both groups had started before any had finished.
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    assert slow2.done() and slow2.result() == first


def test_worker_seconds_time_the_method_inside_each_rank(echo2):
    echo2.pop_worker_seconds()  # calls made by earlier tests on this module-scoped group
    started = time.monotonic()
    future = echo2.call_async(EchoWorker.sleep, 0.2)
    future.result()
    wall = time.monotonic() - started
    assert sorted(future.worker_seconds) == [0, 1]
    assert all(0.2 <= seconds < wall for seconds in future.worker_seconds.values())  # the wall adds the dispatch
    second = echo2.call_async(EchoWorker.sleep, 0.1)
    second.result()
    per_method = echo2.pop_worker_seconds()
    assert list(per_method) == ["sleep"]
    # per method: the slowest rank of each call, summed over calls
    slowest = max(future.worker_seconds.values()) + max(second.worker_seconds.values())
    assert per_method["sleep"] == pytest.approx(slowest, rel=1e-9)
    assert echo2.pop_worker_seconds() == {}


def test_methods_are_checked_against_the_group_class(echo2):
    with pytest.raises(TypeError, match="not a dispatched method of EchoWorker"):
        echo2.call(ValueWorker.compute_values, make_batch(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no declared dispatch"):
        echo2.call(make_batch, 2)  # type: ignore[arg-type]


# --- colocated roles (hybrid engine) and split placement -------------------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_and_critic(ray_runtime):
    actor_pool, critic_pool = cpu_pool(ray_runtime, "actor_rollout_ref", 2), cpu_pool(ray_runtime, "critic", 2)
    # half of each bundle: test_local_mode_matches_ray starts a second group on the same devices
    hybrid = WorkerGroup(ActorRolloutRefWorker, actor_pool, name="actor_rollout_ref", kwargs={"seed": 3},
                         bundle_share=0.5)
    critic = WorkerGroup(ValueWorker, critic_pool, name="critic")
    yield hybrid, critic
    for group in (hybrid, critic):
        group.shutdown()
    for pool in (actor_pool, critic_pool):
        pool.release()


def prompts(rows: int = 6) -> Batch:
    generator = torch.Generator().manual_seed(0)
    return Batch(tensors={"input_ids": torch.randint(0, 16, (rows, 5), generator=generator)})


def test_colocated_roles_share_one_model_object(hybrid_and_critic):
    hybrid, _ = hybrid_and_critic
    for identity in hybrid.call(ActorRolloutRefWorker.model_identity):
        assert len(set(identity["id"])) == 1 and len(set(identity["data_ptr"])) == 1
    before = hybrid.call(ActorRolloutRefWorker.generate_sequences, prompts())
    ref_before = hybrid.call(ActorRolloutRefWorker.compute_ref_log_prob, before)["ref_log_probs"]
    target = Batch(tensors={"input_ids": before["input_ids"], "responses": (before["responses"] + 1) % 16})
    losses = hybrid.call(ActorRolloutRefWorker.update_actor, target)
    assert len(losses) == 2 and losses[0] != losses[1]  # each DP rank saw its own shard
    # the actor's update is visible to the rollout and reference roles: they hold the same module
    ref_after = hybrid.call(ActorRolloutRefWorker.compute_ref_log_prob, before)["ref_log_probs"]
    assert not torch.allclose(ref_before, ref_after)
    # gradients were all-reduced, so both DP ranks still hold identical weights
    checksums = [identity["checksum"] for identity in hybrid.call(ActorRolloutRefWorker.model_identity)]
    assert checksums[0] == pytest.approx(checksums[1], abs=1e-6)


def test_split_placement_uses_separate_pools_and_processes(hybrid_and_critic):
    hybrid, critic = hybrid_and_critic
    assert hybrid.pool.placement_groups[0].id != critic.pool.placement_groups[0].id
    hybrid_pids = {location.pid for location in hybrid.locations}
    assert hybrid_pids.isdisjoint(critic.call(ValueWorker.pid))
    # critic values and reference log-probs computed at the same time, then gathered together
    batch = hybrid.call(ActorRolloutRefWorker.generate_sequences, prompts(5))
    values, ref = gather(critic.call_async(ValueWorker.compute_values, batch),
                         hybrid.call_async(ActorRolloutRefWorker.compute_ref_log_prob, batch))
    assert values["values"].shape == ref["ref_log_probs"].shape == (5, 5)


# --- the serial executor (local mode) ---------------------------------------------------------------------------------


@pytest.mark.long  # a fresh 2-rank group beside a local-mode one: 93 s inside the parallel suite (2026-12-02)
def test_local_mode_matches_ray(hybrid_and_critic, echo4):
    hybrid, _ = hybrid_and_critic
    local = start_ray(ray_config(local_mode=True))
    pool = ResourcePool.create(PoolSpec("local", devices_per_node=2, device="cpu"), local)
    local_hybrid = WorkerGroup(ActorRolloutRefWorker, pool, name="actor_rollout_ref", kwargs={"seed": 7})
    ray_hybrid = WorkerGroup(ActorRolloutRefWorker, hybrid.pool, name="fresh", kwargs={"seed": 7}, bundle_share=0.5)
    try:
        for group in (local_hybrid, ray_hybrid):
            assert [loc.rank for loc in group.locations] == [0, 1]
        local_out = local_hybrid.call(ActorRolloutRefWorker.generate_sequences, prompts(7))
        ray_out = ray_hybrid.call(ActorRolloutRefWorker.generate_sequences, prompts(7))
        assert torch.equal(local_out["responses"], ray_out["responses"])
        local_ref = local_hybrid.call(ActorRolloutRefWorker.compute_ref_log_prob, local_out)
        ray_ref = ray_hybrid.call(ActorRolloutRefWorker.compute_ref_log_prob, ray_out)
        assert torch.equal(local_ref["ref_log_probs"], ray_ref["ref_log_probs"])
    finally:
        local_hybrid.shutdown()
        ray_hybrid.shutdown()
    echo_pool = ResourcePool.create(PoolSpec("local_echo", devices_per_node=4, device="cpu"), local)
    with WorkerGroup(EchoWorker, echo_pool, name="echo_local", args=(1.0,), tp_size=2) as local_echo:
        batch = make_batch(7)
        for method in (EchoWorker.add_offset, EchoWorker.leader_echo):
            assert torch.equal(local_echo.call(method, batch)["rank"], echo4.call(method, batch)["rank"])
        assert local_echo.call(EchoWorker.seen_rows) == echo4.call(EchoWorker.seen_rows)


def test_local_mode_single_rank_has_a_process_group_and_surfaces_the_original_exception():
    local = start_ray(ray_config(local_mode=True))
    pool = ResourcePool.create(PoolSpec("single", devices_per_node=1, device="cpu"), local)
    with WorkerGroup(EchoWorker, pool, name="debug") as group:
        assert group.call(EchoWorker.all_reduce_sum, 4.0) == 4.0  # a real one-rank gloo group
        with pytest.raises(WorkerError, match="rank 0 .* raised an exception in raise_on") as caught:
            group.call(EchoWorker.raise_on, 0)
        assert isinstance(caught.value.__cause__, ValueError)  # the worker's own exception, for pdb.pm()
        assert "sample_workers.py" in caught.value.remote_traceback
        assert group.call(EchoWorker.whoami, "still usable") == ("still usable", 0)


# --- placement errors -------------------------------------------------------------------------------------------------


def test_placement_fails_fast_when_the_cluster_is_too_small(ray_runtime):
    start = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=r"requested 64 CPUs .*cluster has 16 CPUs"):
        ResourcePool.create(PoolSpec("huge", nnodes=2, devices_per_node=32, device="cpu"), ray_runtime, timeout_s=120)
    with pytest.raises(ResourceUnavailableError, match="requested 2 GPUs .*cluster has 0 GPUs"):
        ResourcePool.create(PoolSpec("gpus", devices_per_node=2, device="cuda"), ray_runtime, timeout_s=120)
    assert time.monotonic() - start < 60  # at once, not after the 120 s placement timeout each was given


def test_pools_that_together_exceed_the_cluster_are_refused_before_any_is_placed(ray_runtime):
    """A trainer pool that fits and a rollout pool that would fit alone, but not beside it: refused naming both,
    with nothing reserved (so no wait for the placement timeout)."""
    import ray
    from ray.util import placement_group_table

    from hybridrl.runtime import ResourcePoolManager

    total = int(ray.cluster_resources()["CPU"])
    before = {key for key, group in placement_group_table().items() if group["state"] != "REMOVED"}
    manager = ResourcePoolManager([PoolSpec("global", devices_per_node=total - 1, device="cpu"),
                                   PoolSpec("rollout0", devices_per_node=2, device="cpu")],
                                  {"actor": "global", "rollout0": "rollout0"})
    with pytest.raises(ResourceUnavailableError,
                       match=rf"pools 'global' {total - 1} \+ 'rollout0' 2 request {total + 1} CPUs together, "
                             rf"cluster has {total} CPUs"):
        manager.create(ray_runtime, timeout_s=120)
    assert manager.pools == {}
    assert {key for key, group in placement_group_table().items() if group["state"] != "REMOVED"} == before


def test_placement_times_out_when_devices_stay_busy(ray_runtime, echo2):
    import ray

    from hybridrl.runtime import release_parked_workers

    release_parked_workers()  # a parked reservation would be freed for the new pool: only echo2's stays busy
    free, deadline = -1, time.monotonic() + 10
    while free != (free := int(ray.available_resources().get("CPU", 0))) and time.monotonic() < deadline:
        time.sleep(0.25)  # the released reservations' CPUs come back a moment later: read until it holds still
    start = time.monotonic()
    with pytest.raises(ResourceUnavailableError, match=rf"could not be placed within 1 s: requested {free + 1} CPUs"):
        ResourcePool.create(PoolSpec("late", devices_per_node=free + 1, device="cpu"), ray_runtime, timeout_s=1.0)
    assert time.monotonic() - start < 5
