"""Faults inside a run that must stop it cleanly: a full disk while saving a checkpoint (a clear error, the previous
checkpoint intact and still the one ``latest`` names), and too many non-finite steps in a row (a diagnosis; skipped
steps leave the weights unchanged)."""

from __future__ import annotations

import pytest
from reliability_helpers import checkpoint_weights, overrides

from hybridrl.config import load_config
from hybridrl.trainers.checkpoints import CheckpointManager, CheckpointWriteError, load_trainer_state
from hybridrl.trainers.faults import NonFiniteTrainingError
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.slow, pytest.mark.long]


def test_disk_full_while_saving_is_a_clear_error_and_keeps_the_previous_checkpoint(model_dir, tmp_path):
    """The full disk is simulated: ``OSError(ENOSPC)`` is raised where the controller writes its trainer state into
    the checkpoint of step 2 — after the workers have written their shards (``trainer.fault_injection``)."""
    run_dir = tmp_path / "run"
    config = load_config(overrides(model_dir, run_dir, "trainer.total_training_steps=2",
                                   "trainer.fault_injection.checkpoint_write_error_at_step=2"))
    with pytest.raises(CheckpointWriteError) as caught:
        RLTrainer(config).fit()
    message = str(caught.value)
    assert "could not write checkpoint global_step_2" in message
    assert "the disk is full (No space left on device)" in message
    assert f"the previous checkpoint {run_dir / 'checkpoints' / 'global_step_1'} is intact" in message
    manager = CheckpointManager(run_dir)
    assert manager.latest().name == "global_step_1" and manager.steps() == [1]
    assert not (run_dir / "checkpoints" / "global_step_2.partial").exists()
    assert load_trainer_state(manager.latest())["global_step"] == 1
    assert "lm_head.weight" in checkpoint_weights(manager.latest())


def test_consecutive_nonfinite_steps_stop_the_run_with_a_diagnosis(model_dir, tmp_path):
    """From step 2 on the advantages are NaN (``trainer.fault_injection``): the actor's loss and gradients are
    non-finite, each optimizer step is skipped, and after 2 such steps the run stops (it would have run 4)."""
    run_dir = tmp_path / "run"
    config = load_config(overrides(model_dir, run_dir, "trainer.total_training_steps=4",
                                   "trainer.max_consecutive_nonfinite_steps=2",
                                   "trainer.fault_injection.nonfinite_advantages_from_step=2"))
    with pytest.raises(NonFiniteTrainingError) as caught:
        RLTrainer(config).fit()
    message = str(caught.value)
    assert "2 consecutive steps (2-3) had non-finite gradients" in message
    assert "weights have not changed since step 1" in message and "actor/grad_norm=nan" in message
    assert "likely causes: a learning rate too high" in message
    assert f"({run_dir / 'checkpoints' / 'global_step_2'})" in message  # where to resume from
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert rows[0]["actor/skipped_step"] == 0 and rows[1]["actor/skipped_step"] > 0 and rows[2]["actor/skipped_step"] > 0
    assert rows[1]["actor/grad_norm"] is None  # NaN is written as null
    step1, step2 = (checkpoint_weights(run_dir / "checkpoints" / f"global_step_{k}") for k in (1, 2))
    for name, tensor in step1.items():
        assert step1[name].equal(step2[name]), name  # the skipped step left the weights unchanged
