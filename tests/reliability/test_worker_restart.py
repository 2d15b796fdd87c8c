"""``trainer.max_restarts``: a worker process killed (SIGKILL) in the middle of a step is reported with its role and
rank within seconds; the controller then restarts its worker groups, resumes from the last checkpoint by itself, and
the run ends exactly as an uninterrupted one (CPU, fixed seed). The kill is real: the controller sends SIGKILL to the
worker's pid at the chosen step (``trainer.fault_injection``, a test-only hook)."""

from __future__ import annotations

import pytest
from reliability_helpers import assert_same_run, overrides

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.slow, pytest.mark.long]


def test_worker_killed_mid_step_restarts_and_resumes_bit_exact(model_dir, straight_run, tmp_path):
    run_dir = tmp_path / "run"
    trainer = RLTrainer(load_config(overrides(model_dir, run_dir, "trainer.max_restarts=1",
                                              "trainer.fault_injection.kill_worker_at_step=3",
                                              "trainer.fault_injection.kill_worker_rank=1")))
    result = trainer.fit()
    assert result.global_step == 3
    [restart] = result.restarts
    assert (restart.role, restart.rank) == ("actor_rollout_ref", 1)
    assert "worker group 'actor_rollout_ref' rank 1" in restart.error and "died" in restart.error
    assert restart.failed_after_step == 2 and restart.resumed_step == 2
    assert restart.resumed_from == run_dir / "checkpoints" / "global_step_2"
    detection_s = restart.failed_at - trainer.faults.worker_killed_at
    assert 0 <= detection_s < 10
    assert len(result.history) == 3
    assert_same_run(straight_run, run_dir)
    print(f"\ndead worker reported {detection_s:.2f} s after the kill; restart + resume took {restart.restart_s:.1f} s")


def test_tensor_parallel_vllm_replica_killed_restarts_and_stays_in_sync(model_dir, tmp_path):
    """A rank of a t_g = 2 vLLM replica (vLLM's CPU build, colocated) killed mid-step: reported with its rank, the
    groups restart, the new replica is synced from the last checkpoint and the run ends with the rollout's log-probs
    still matching the trainer's (the per-step gate) — no stale engine after the restart."""
    run_dir = tmp_path / "run"
    trainer = RLTrainer(load_config(overrides(
        model_dir, run_dir, "rollout=vllm_cpu", "rollout.tensor_model_parallel_size=2", "trainer.max_restarts=1",
        "trainer.fault_injection.kill_worker_at_step=2", "trainer.fault_injection.kill_worker_rank=1")))
    result = trainer.fit()
    assert result.global_step == 3
    [restart] = result.restarts
    assert (restart.role, restart.rank) == ("actor_rollout_ref", 1) and restart.resumed_step == 1
    assert len(result.history) == 3
    for metrics in result.history:
        assert metrics["rollout/log_prob_diff_max"] < 1e-4, metrics["rollout/log_prob_diff_max"]


def test_standalone_replica_killed_the_run_goes_on_with_the_survivor(model_dir, tmp_path):
    """Split placement, 1 trainer rank + 2 vLLM replicas of t_g = 1: replica 1 killed mid-step 2. No restart is
    needed: the next sync skips it, its prompts go to replica 0, every step still trains on samples whose
    log-probs match the trainer's, and the loss is in the metrics."""
    run_dir = tmp_path / "run"
    trainer = RLTrainer(load_config(overrides(
        model_dir, run_dir, "rollout=vllm_cpu", "trainer.n_gpus_per_node=1", "rollout.n_gpus=2",
        "trainer.fault_injection.kill_worker_at_step=2", "trainer.fault_injection.kill_worker_role=rollout1")))
    result = trainer.fit()
    assert result.global_step == 3 and not result.restarts and len(result.history) == 3
    assert [metrics["rollout/replicas_lost"] for metrics in result.history] == [0.0, 1.0, 1.0]
    for metrics in result.history:
        assert metrics["rollout/log_prob_diff_max"] < 1e-4, metrics["rollout/log_prob_diff_max"]
