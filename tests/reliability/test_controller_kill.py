"""The controller killed with SIGKILL — mid-step, then again in the middle of a checkpoint write — and restarted with
``trainer.resume_mode=auto`` ends with the same metrics and weights as an uninterrupted run, bit for bit (CPU, fixed
seed). The kills are real ``SIGKILL``s (sent by the controller to itself at the chosen point through
``trainer.fault_injection``), so no clean-up code runs; every restart starts a fresh private Ray instance, and the test
checks that no process of a killed controller (its Ray head, raylet, workers) outlives it — except Ray's two per-node
agents, which exit by themselves about a minute later and do not hold up the restart (the helper kills them)."""

from __future__ import annotations

import signal

import pytest
from reliability_helpers import assert_same_run, overrides, run_train_subprocess

from hybridrl.config import load_config
from hybridrl.trainers.checkpoints import TRAINER_STATE, CheckpointManager
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.slow, pytest.mark.long]


def test_sigkill_mid_step_and_mid_checkpoint_write_then_resume_is_bit_exact(model_dir, straight_run, tmp_path):
    run_dir = tmp_path / "run"
    manager = CheckpointManager(run_dir)

    killed = run_train_subprocess(overrides(model_dir, run_dir, "trainer.fault_injection.kill_controller_at_step=3"),
                                  tmp_path / "first.log")
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    assert killed.leaked == {}  # Ray's head, raylet and workers went down with their controller
    assert manager.latest().name == "global_step_2" and manager.steps() == [1, 2]

    killed = run_train_subprocess(overrides(model_dir, run_dir, "trainer.resume_mode=auto",
                                            "trainer.fault_injection.kill_controller_at_step=3",
                                            "trainer.fault_injection.kill_controller_phase=checkpoint_write"),
                                  tmp_path / "second.log")
    assert killed.returncode == -signal.SIGKILL, killed.output[-3000:]
    assert killed.leaked == {}
    assert [row["step"] for row in read_metrics(run_dir)] == [1, 2, 3]  # resumed at 2, step 3 ran, then the kill
    partial = run_dir / "checkpoints" / "global_step_3.partial"
    assert (partial / "actor" / "dcp" / ".metadata").is_file()  # the workers' shards were on disk ...
    assert not (partial / TRAINER_STATE).exists()  # ... the commit never happened
    assert manager.latest().name == "global_step_2" and manager.steps() == [1, 2]  # never picks up the partial

    result = RLTrainer(load_config(overrides(model_dir, run_dir, "trainer.resume_mode=auto"))).fit()
    assert result.global_step == 3 and len(result.history) == 1  # only step 3 ran again
    assert not partial.exists() and manager.latest().name == "global_step_3"
    assert_same_run(straight_run, run_dir)
    print(f"\nsecond child killed after {killed.seconds:.1f} s")
