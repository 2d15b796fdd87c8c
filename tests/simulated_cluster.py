"""A simulated multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``: several raylets), for tests of
placement and transports across nodes. It owns the Ray session while open: a local Ray instance of earlier tests
is shut down first (it cannot take a second raylet)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import ray
from ray.cluster_utils import Cluster

from hybridrl.config.ray import RayConfig
from hybridrl.runtime import start_ray


@contextmanager
def simulated_nodes(num_nodes: int = 2, cpus_per_node: int = 1) -> Iterator[str]:
    """Yield the address of a cluster of ``num_nodes`` raylets with ``cpus_per_node`` CPUs each, Ray started on it."""
    if ray.is_initialized():
        ray.shutdown()
    node_args = {"num_cpus": cpus_per_node, "object_store_memory": 100 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    for _ in range(num_nodes - 1):
        cluster.add_node(**node_args)
    cluster.wait_for_nodes()
    runtime = start_ray(RayConfig(address=cluster.address))
    try:
        alive = [node["Resources"].get("CPU") for node in ray.nodes() if node["Alive"]]
        assert alive == [float(cpus_per_node)] * num_nodes, alive
        yield cluster.address
    finally:
        runtime.shutdown()
        cluster.shutdown()
