"""Damaged checkpoints, on real files of a real run: every checkpoint carries a manifest (sizes and SHA-256); resume and
export check it. ``resume_mode=auto`` skips a damaged checkpoint with a warning and resumes from the newest intact one
(the run still ends equal to an uninterrupted one); ``resume_path`` and ``hybridrl export`` refuse it, naming the file.
Cases: a truncated shard, a missing shard, a truncated trainer state, and an old checkpoint without a manifest."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

import pytest
from reliability_helpers import assert_same_run, overrides

from hybridrl.config import load_config
from hybridrl.trainers.checkpoints import (MANIFEST, TRAINER_STATE, CheckpointManager, DamagedCheckpointError,
                                           verify_checkpoint)
from hybridrl.trainers.rl_trainer import RLTrainer

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]


@pytest.fixture
def run_copy(straight_run, tmp_path):
    """A copy of the uninterrupted 3-step run (a checkpoint after every step) to damage."""
    copy = tmp_path / "run"
    shutil.copytree(straight_run, copy)
    return copy


def shard(checkpoint):
    return sorted((checkpoint / "actor" / "dcp").glob("*.distcp"))[0]


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def test_every_checkpoint_has_a_manifest_that_verifies(straight_run):
    for step in (1, 2, 3):
        checkpoint = straight_run / "checkpoints" / f"global_step_{step}"
        assert (checkpoint / MANIFEST).is_file() and verify_checkpoint(checkpoint)


def test_auto_resume_skips_a_truncated_shard_and_ends_like_the_uninterrupted_run(run_copy, model_dir, straight_run,
                                                                                   caplog):
    latest = run_copy / "checkpoints" / "global_step_3"
    truncate(shard(latest))
    with pytest.raises(DamagedCheckpointError, match=rf"{shard(latest).name} has \d+ bytes, \d+ were written"):
        verify_checkpoint(latest)
    assert CheckpointManager(run_copy).intact_latest().name == "global_step_2"
    with caplog.at_level(logging.WARNING):
        result = RLTrainer(load_config(overrides(model_dir, run_copy, "trainer.resume_mode=auto"))).fit()
    assert "skipping a damaged checkpoint" in caplog.text and "global_step_3" in caplog.text
    assert result.global_step == 3 and len(result.history) == 1  # resumed at 2: only step 3 ran again
    assert_same_run(straight_run, run_copy)  # and rewrote step 3's checkpoint whole
    assert verify_checkpoint(latest)


def test_resume_path_and_export_refuse_a_missing_shard_naming_it(run_copy, model_dir, tmp_path):
    checkpoint = run_copy / "checkpoints" / "global_step_3"
    missing = shard(checkpoint)
    missing.unlink()
    config = load_config(overrides(model_dir, tmp_path / "elsewhere", "trainer.resume_mode=resume_path",
                                   f"trainer.resume_from_path={checkpoint}"))
    with pytest.raises(DamagedCheckpointError, match=rf"{missing.name} is missing"):
        RLTrainer(config).fit()
    process = subprocess.run([sys.executable, "-m", "hybridrl.cli", "export", str(run_copy), str(tmp_path / "hf")],
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 2 and "Traceback" not in process.stderr, process.stderr[-3000:]
    assert f"actor/dcp/{missing.name} is missing" in process.stderr
    assert not (tmp_path / "hf").exists()


def test_a_truncated_trainer_state_is_named_with_or_without_a_manifest(run_copy):
    checkpoint = run_copy / "checkpoints" / "global_step_3"
    truncate(checkpoint / TRAINER_STATE)
    with pytest.raises(DamagedCheckpointError, match=rf"{TRAINER_STATE} has \d+ bytes"):
        verify_checkpoint(checkpoint)
    (checkpoint / MANIFEST).unlink()  # as written before manifests existed: loaded unverified, still named
    assert verify_checkpoint(checkpoint) is False
    from hybridrl.trainers.checkpoints import load_trainer_state

    with pytest.raises(DamagedCheckpointError, match=rf"{TRAINER_STATE} cannot be read \(truncated\?\)"):
        load_trainer_state(checkpoint)
    assert CheckpointManager(run_copy).intact_latest().name == "global_step_2"


def test_export_to_a_path_under_a_regular_file_is_named(straight_run, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    process = subprocess.run([sys.executable, "-m", "hybridrl.cli", "export", str(straight_run),
                              str(blocker / "hf")], capture_output=True, text=True, timeout=300)
    assert process.returncode == 2 and "Traceback" not in process.stderr, process.stderr[-3000:]
    assert "is a regular file, not a directory" in process.stderr
