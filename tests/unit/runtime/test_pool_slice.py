"""``ResourcePool.slice``: a colocated replica's ``t_g`` devices of the actor's pool, seen as a pool of its own."""

from __future__ import annotations

import pytest

from hybridrl.runtime import PoolSpec, ResourcePool


def placed_pool(nnodes: int, per_node: int) -> ResourcePool:
    """A pool as ``ResourcePool.create`` leaves it: one placement group per node (stand-in objects: slicing only
    reads which group and which bundle each rank is)."""
    return ResourcePool(PoolSpec("global", nnodes=nnodes, devices_per_node=per_node, device="cpu"), runtime=None,
                        placement_groups=[f"node{index}" for index in range(nnodes)])


def test_a_slice_renumbers_its_ranks_and_keeps_the_bundles_they_are():
    pool = placed_pool(nnodes=2, per_node=4)
    second_node_pair = pool.slice(6, 2)
    assert second_node_pair.world_size == 2
    assert [(slot.rank, slot.local_rank) for slot in second_node_pair.slots()] == [(0, 0), (1, 1)]
    assert [(slot.placement_group, slot.bundle) for slot in second_node_pair.slots()] == [("node1", 2), ("node1", 3)]
    # its threads are counted against the node's 4 slots, as the actor's ranks on those bundles are
    assert second_node_pair.spec.node_slots == 4 and second_node_pair.spec.devices_per_node == 2
    assert [slot.bundle for slot in pool.slots()] == [0, 1, 2, 3, 0, 1, 2, 3]  # the pool itself is unchanged


@pytest.mark.parametrize(("first", "count"), [(3, 2), (-1, 1), (7, 2), (0, 0)])
def test_a_slice_must_be_devices_of_one_node(first, count):
    with pytest.raises(ValueError, match="device"):
        placed_pool(nnodes=2, per_node=4).slice(first, count)
