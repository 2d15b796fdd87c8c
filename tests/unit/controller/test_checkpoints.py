"""Checkpoint directories: atomic commit, latest pointer, keep-last-k, partial writes never picked up."""

from __future__ import annotations

import pytest

from hybridrl.trainers.checkpoints import CheckpointManager, load_trainer_state, resume_checkpoint


def commit(manager: CheckpointManager, step: int) -> None:
    partial = manager.partial_dir(step)
    (partial / "actor").mkdir()
    (partial / "actor" / "shard").write_text(str(step))
    manager.commit(step, {"global_step": step})


def test_commit_points_latest_and_prunes(tmp_path):
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        commit(manager, step)
    assert manager.steps() == [2, 3]
    assert manager.latest().name == "global_step_3"
    assert load_trainer_state(manager.latest())["global_step"] == 3


def test_partial_checkpoint_is_never_resumed(tmp_path):
    manager = CheckpointManager(tmp_path)
    commit(manager, 1)
    partial = manager.partial_dir(2)  # a crash mid-write leaves this behind
    (partial / "actor").mkdir()
    assert manager.latest().name == "global_step_1"
    assert resume_checkpoint("auto", tmp_path, None).name == "global_step_1"


def test_stale_pointer_falls_back_to_newest_complete(tmp_path):
    manager = CheckpointManager(tmp_path)
    commit(manager, 1)
    (manager.root / "latest").write_text("global_step_9")
    assert manager.latest().name == "global_step_1"


def test_resume_modes(tmp_path):
    assert resume_checkpoint("auto", tmp_path, None) is None
    assert resume_checkpoint("disable", tmp_path, None) is None
    with pytest.raises(ValueError, match="not a hybridrl checkpoint"):
        resume_checkpoint("resume_path", tmp_path, str(tmp_path))


def test_metrics_file_is_trimmed_on_resume_and_rotated_on_a_fresh_run(tmp_path):
    import json

    from hybridrl.utils.tracking import prepare_metrics_file, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": step, "x": step}) + "\n" for step in range(5)))
    prepare_metrics_file(tmp_path, resumed_step=2)  # steps 3 and 4 were logged after the checkpoint
    assert [row["step"] for row in read_metrics(tmp_path)] == [0, 1, 2]
    prepare_metrics_file(tmp_path, resumed_step=0)
    assert not path.exists() and (tmp_path / "metrics.jsonl.1").is_file()
