"""One run per run directory, with real processes: a second ``hybridrl train`` in the directory of a running one is
refused at once (exit 2, naming the directory and the other run's process) and leaves the first run's record alone;
the lock of a run that was SIGKILLed never blocks the next one; a directory that cannot be one is named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from reliability_helpers import overrides, reap_process_group

from hybridrl.trainers.run_lock import LOCK_FILE, RunDirectoryInUse, run_directory_lock
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def holder_pid(run_dir):
    try:
        return json.loads((run_dir / LOCK_FILE).read_text() or "{}").get("pid")
    except (OSError, ValueError):
        return None


@pytest.mark.long
def test_second_run_in_a_running_runs_directory_is_refused_and_a_killed_runs_lock_does_not_block(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = overrides(model_dir, run_dir, "trainer.total_training_steps=1000", "trainer.save_freq=-1",
                     "trainer.save_at_end=false")  # long enough to be running while the second one tries
    command = [sys.executable, "-m", "hybridrl.cli", "train", "--no-check-paths", *args]
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen(command, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: holder_pid(run_dir) == first.pid and (run_dir / "metrics.jsonl").is_file()
                          and read_metrics(run_dir), timeout_s=240), (tmp_path / "first.log").read_text()[-3000:]
        second = subprocess.run(command, capture_output=True, text=True, timeout=180)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        assert f"trainer.default_local_dir='{run_dir}' is in use by another run (pid {first.pid}" in second.stderr
        assert "workers started" not in second.stderr  # refused before Ray or any worker
        assert first.poll() is None  # the first run is still training
        os.killpg(first.pid, signal.SIGKILL)  # as the OOM killer would: no clean-up runs
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        reap_process_group(first.pid, timeout_s=15)
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text()[-3000:]
    steps = [row["step"] for row in read_metrics(run_dir)]
    assert steps == list(range(1, len(steps) + 1))  # one run's record, nothing interleaved
    assert holder_pid(run_dir) == first.pid  # the killed run left its lock file behind ...
    with run_directory_lock(run_dir):  # ... and it does not block
        assert holder_pid(run_dir) == os.getpid()


def test_same_directory_twice_in_one_process_is_refused(tmp_path):
    with run_directory_lock(tmp_path / "run"):
        with pytest.raises(RunDirectoryInUse, match="already used by another run in this process"):
            with run_directory_lock(tmp_path / "run"):
                pass
    with run_directory_lock(tmp_path / "run"):  # released on leaving
        pass


def test_directories_that_cannot_hold_a_run_are_named(tmp_path):
    regular = tmp_path / "a_file"
    regular.write_text("x")
    with pytest.raises(ValueError, match="trainer.default_local_dir=.*a_file.*a file \\(not a directory\\)"):
        with run_directory_lock(regular):
            pass
    with pytest.raises(ValueError, match="trainer.default_local_dir=.*regular file, not a directory"):
        with run_directory_lock(regular / "run"):
            pass


def test_a_read_only_directory_is_named(tmp_path):
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o555)
    immutable = os.geteuid() == 0  # root writes into mode-0555 directories: make this one immutable instead
    if immutable and (shutil.which("chattr") is None
                      or subprocess.run(["chattr", "+i", str(read_only)], capture_output=True).returncode != 0):
        pytest.skip("running as root on a filesystem without chattr +i: no directory here is read-only to us")
    try:
        with pytest.raises(ValueError, match="trainer.default_local_dir=.*not writable"):
            with run_directory_lock(read_only / "run"):
                pass
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(read_only)], check=True)
