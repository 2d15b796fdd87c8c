"""Multi-node placement on a simulated two-node Ray cluster (two raylets with 2 CPUs each, on this machine).

This module owns its Ray session: it must not share one with the other modules (their local instance is not a
cluster other raylets can join)."""

from __future__ import annotations

import pytest
import ray
from distributed_helpers import cpu_pool, ray_config
from ray.cluster_utils import Cluster
from sample_workers import EchoWorker, make_batch

from hybridrl.runtime import ResourceUnavailableError, WorkerGroup, start_ray

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(180)]

NODE_ARGS = {"num_cpus": 2, "object_store_memory": 100 * 2**20}


@pytest.fixture(scope="module")
def two_node_runtime():
    if ray.is_initialized():  # a session left over from another module would make us reuse the wrong cluster
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args=NODE_ARGS)
    cluster.add_node(**NODE_ARGS)
    cluster.wait_for_nodes()
    runtime = start_ray(ray_config(address=cluster.address, num_cpus=None))
    try:
        yield runtime
    finally:
        runtime.shutdown()
        cluster.shutdown()


def test_group_spans_both_nodes_and_all_reduces(two_node_runtime):
    assert len([node for node in ray.nodes() if node["Alive"]]) == 2
    pool = cpu_pool(two_node_runtime, "multinode", devices=2, nnodes=2)
    try:
        with WorkerGroup(EchoWorker, pool, name="actor", args=(0.0,)) as group:
            node_of_rank = [location.node_id for location in group.locations]
            assert node_of_rank[0] == node_of_rank[1] and node_of_rank[2] == node_of_rank[3]
            assert node_of_rank[0] != node_of_rank[2]  # node by node: ranks 0-1 on one raylet, 2-3 on the other
            assert group.call(EchoWorker.all_reduce_sum, 1.0) == 10.0  # 1 + 2 + 3 + 4
            out = group.call(EchoWorker.add_offset, make_batch(6))
            assert out["rank"].tolist() == [0, 0, 1, 1, 2, 2]  # padded to 8: rank 3 holds only padding
    finally:
        pool.release()


def test_a_node_share_larger_than_any_node_is_refused(two_node_runtime):
    with pytest.raises(ResourceUnavailableError, match="requested 4 CPUs on one node, the largest node has 2"):
        cpu_pool(two_node_runtime, "too_wide", devices=4, nnodes=1)
