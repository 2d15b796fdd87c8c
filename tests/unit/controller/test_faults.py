"""Fault handling without Ray: the non-finite streak guard, the restart supervisor's policy, checkpoint-write errors,
and a process killed (SIGKILL, from outside) in the middle of writing a checkpoint."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hybridrl.trainers.checkpoints import TRAINER_STATE, CheckpointManager, load_trainer_state
from hybridrl.runtime.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from hybridrl.trainers.faults import NonFiniteGuard, NonFiniteTrainingError
from hybridrl.trainers.restarts import Supervisor

FINITE = {"actor/skipped_step": 0.0, "actor/grad_norm": 0.5}
SKIPPED = {"actor/skipped_step": 2.0, "actor/grad_norm": float("nan"), "actor/pg_loss": float("nan")}


def test_nonfinite_guard_counts_only_consecutive_steps():
    guard = NonFiniteGuard(limit=3)
    for step, metrics in enumerate([SKIPPED, SKIPPED, FINITE, SKIPPED, SKIPPED], start=1):
        guard.observe(step, metrics)  # the finite step 3 resets the streak
    with pytest.raises(NonFiniteTrainingError) as caught:
        guard.observe(6, SKIPPED)
    message = str(caught.value)
    assert "3 consecutive steps (4-6)" in message and "since step 3" in message
    assert "non-finite metrics: actor/grad_norm, actor/pg_loss" in message and "no checkpoint" in message


def test_nonfinite_guard_counts_critic_skips_and_zero_disables():
    guard = NonFiniteGuard(limit=1)
    with pytest.raises(NonFiniteTrainingError, match="1 consecutive steps"):
        guard.observe(1, {"critic/skipped_step": 1.0})
    never = NonFiniteGuard(limit=0)
    for step in range(1, 20):
        never.observe(step, SKIPPED)


def died(rank: int = 1) -> WorkerDiedError:
    return WorkerDiedError("actor_rollout_ref", rank, "update_actor", None)


def test_supervisor_restarts_lost_workers_up_to_the_limit():
    failures = [died(1), WorkerTimeoutError("critic", 0, "update_critic", None)]
    supervisor = Supervisor(max_restarts=2)
    steps = iter([4, 6])

    def attempt():
        if failures:
            raise failures.pop(0)
        supervisor.resumed(None, 0)

    supervisor.run(attempt, lambda: next(steps))
    assert [(r.role, r.rank, r.failed_after_step) for r in supervisor.records] == [
        ("actor_rollout_ref", 1, 4), ("critic", 0, 6)]
    assert supervisor.records[-1].restart_s is not None and not supervisor.restarting


def test_supervisor_gives_up_after_max_restarts_and_never_retries_a_worker_exception():
    supervisor = Supervisor(max_restarts=1)
    with pytest.raises(WorkerDiedError):
        supervisor.run(lambda: (_ for _ in ()).throw(died()), lambda: 0)
    assert len(supervisor.records) == 1
    calls = []

    def raising():
        calls.append(1)
        raise WorkerError("actor_rollout_ref", 0, "update_actor", None, "ValueError: bad batch")

    with pytest.raises(WorkerError, match="bad batch"):
        Supervisor(max_restarts=3).run(raising, lambda: 0)
    assert calls == [1]


def test_failed_checkpoint_write_is_removed_and_named(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.partial_dir(1)
    manager.commit(1, {"global_step": 1})
    (manager.partial_dir(2) / "actor").mkdir()
    remote = WorkerError("actor_rollout_ref", 0, "save_checkpoint", None,
                         remote_traceback="OSError: [Errno 28] No space left on device")
    for error in (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), remote):
        message = str(manager.abort(2, error))
        assert "global_step_2" in message and "the disk is full" in message
        assert f"previous checkpoint {tmp_path / 'checkpoints' / 'global_step_1'} is intact" in message
    assert "PermissionError: denied" in str(manager.abort(2, PermissionError("denied")))
    assert not (manager.root / "global_step_2.partial").exists() and manager.latest().name == "global_step_1"


WRITER = textwrap.dedent("""
    import sys, torch
    from hybridrl.trainers.checkpoints import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    manager.partial_dir(1)
    manager.commit(1, {"global_step": 1})
    manager.partial_dir(2)
    print("writing", flush=True)
    manager.commit(2, {"global_step": 2, "big": torch.ones(96 * 2**20 // 4)})  # ~96 MB: killed while it is written
""")


def test_sigkill_in_the_middle_of_a_checkpoint_write_keeps_the_previous_one(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    state = tmp_path / "checkpoints" / "global_step_2.partial" / TRAINER_STATE
    deadline = time.monotonic() + 30
    while not (state.is_file() and state.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    assert state.is_file() and state.stat().st_size < 96 * 2**20  # really killed mid-write: a truncated file
    manager = CheckpointManager(tmp_path)
    assert manager.latest().name == "global_step_1" and manager.steps() == [1]
    assert load_trainer_state(manager.latest())["global_step"] == 1
    assert [path.name for path in manager.sweep_partials()] == ["global_step_2.partial"]
    assert manager.latest().name == "global_step_1"
