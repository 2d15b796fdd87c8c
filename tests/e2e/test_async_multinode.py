"""Asynchronous training across nodes: the ``async_training`` contract on a simulated two-node Ray cluster (two
raylets with one CPU each on this machine, so the trainer's rank and the rollout replica land on different nodes),
weights over the network — through Ray's object store (``rollout.weight_transfer=object_store``) and over a gloo
group of the trainer's and the replica's ranks (``collective``, TCP); the host's shared memory, which the two
simulated nodes would happen to share, is not used:

- ``one_step_off`` trains every step at staleness 1 (after the first) with the pool on the other node;
- ``bounded`` with η = 0 is the synchronous run, bit for bit;
- the staleness bound holds under random generation delays, and a resume with batches queued is exact.

This module owns its Ray session (a local instance is not a cluster other raylets can join).
"""

from __future__ import annotations

import pytest
from simulated_cluster import simulated_nodes
from test_async_training import N, assert_same_runs, trained_each_prompt_once

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long, pytest.mark.timeout(900)]

@pytest.fixture(scope="module")
def cluster_address():
    with simulated_nodes(2, cpus_per_node=1) as address:
        yield address


@pytest.fixture(scope="module", params=["object_store", "collective"])
def transport(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("async_multinode") / "model")


def run(model_dir, cluster_address, transport, run_dir, steps, *extra) -> RLTrainer:
    """The async contract tests' run (``test_async_training.run``), attached to the cluster: 1 trainer rank on one
    node, a 1-rank pool on the other (each node has one CPU)."""
    trainer = RLTrainer(load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={run_dir}",
        f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", f"trainer.ray.address={cluster_address}",
        "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 4}", "data.train_batch_size=4",
        f"rollout.n={N}", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2",
        "data.max_response_length=3", "actor.optim.lr=1e-2", "actor.use_kl_loss=true", "rollout=vllm_cpu",
        "trainer.n_gpus_per_node=1", "rollout.n_gpus=1", f"rollout.weight_transfer={transport}", *extra]))
    trainer.fit()
    return trainer


def test_one_step_off_trains_with_the_pool_on_another_node(model_dir, cluster_address, transport, tmp_path):
    trainer = run(model_dir, cluster_address, transport, tmp_path / "off", 3, "async_training.mode=one_step_off")
    rows = read_metrics(tmp_path / "off")
    assert [row["async/staleness_max"] for row in rows] == [0, 1, 1]
    assert all(row["weight_sync/bytes"] > 0 for row in rows[1:])   # fetched over the network, not /dev/shm
    assert rows[0]["rollout/log_prob_diff_max"] < 1e-4  # step 0: generated and trained with the same weights
    trained_each_prompt_once(trainer.sample_log)


def test_bounded_with_zero_staleness_is_the_synchronous_run_bit_for_bit(model_dir, cluster_address, transport,
                                                                          tmp_path):
    run(model_dir, cluster_address, transport, tmp_path / "sync", 3)
    run(model_dir, cluster_address, transport, tmp_path / "bounded0", 3, "async_training.mode=bounded",
        "async_training.max_staleness=0")
    assert_same_runs(tmp_path / "sync", tmp_path / "bounded0", 3)


def test_staleness_bound_holds_under_delays_and_resume_is_exact(model_dir, cluster_address, transport, tmp_path):
    bounded = ("async_training.mode=bounded", "async_training.max_staleness=2")
    straight = run(model_dir, cluster_address, transport, tmp_path / "straight", 4, *bounded,
                   "trainer.fault_injection.rollout_delay_s=0.4")
    for step, _, _, versions in straight.sample_log:
        assert versions == [max(step - 2, 0)] * len(versions), step
    # a checkpoint at step 2, with 2 batches queued
    run(model_dir, cluster_address, transport, tmp_path / "resumed", 2, *bounded)
    resumed = run(model_dir, cluster_address, transport, tmp_path / "resumed", 4, *bounded, "trainer.resume_mode=auto",
                  "trainer.fault_injection.rollout_delay_s=0.2")
    assert [step for step, *_ in resumed.sample_log] == [2, 3]
    assert_same_runs(tmp_path / "straight", tmp_path / "resumed", 4)
