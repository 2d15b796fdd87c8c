"""``hybridrl train``: a user mistake prints one message naming the key/file/row — no traceback — and exits with
status 2, within seconds, whether it is caught by validation, by data loading, or after Ray started.

Mistakes caught before Ray runs the command's ``main`` in this process (the same code as the console script); those
about Ray itself (an address, the cluster's size) run the real console script in a subprocess, which also starts
its own private Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_input_cases import encoded, good_rows, jsonl_lines, reward_file, run_overrides, train_files

from hybridrl.trainers.checkpoints import CheckpointManager
from hybridrl.utils.tiny_model import save_tiny_model

CLI_TIMEOUT_S = 180  # generous for a loaded machine; a hang would still fail the test


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("cli") / "model")


def hybridrl_train(*overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``hybridrl train <overrides>``; returns the finished process and its wall time in seconds."""
    script = Path(sys.executable).with_name("hybridrl")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "hybridrl.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    env.pop("HYBRIDRL_TRACEBACK", None)
    started = time.monotonic()
    process = subprocess.run([*command, "train", *overrides], capture_output=True, text=True, env=env,
                             timeout=CLI_TIMEOUT_S)
    return process, time.monotonic() - started


def train_in_process(capsys, *overrides: str) -> subprocess.CompletedProcess:
    """``hybridrl train <overrides>`` through the command's ``main`` in this process, as a finished process."""
    from hybridrl.cli import main

    capsys.readouterr()
    status = main(["train", *overrides])
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(["hybridrl", "train", *overrides], status, captured.out, captured.err)


def assert_refused(process: subprocess.CompletedProcess, *phrases: str) -> None:
    assert process.returncode == 2, (process.returncode, process.stderr[-3000:])
    assert "Traceback" not in process.stderr, process.stderr[-3000:]
    assert "hybridrl train: " in process.stderr
    for phrase in phrases:
        assert phrase in process.stderr, process.stderr[-3000:]


def test_config_mistakes_are_all_named_at_once(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYBRIDRL_TRACEBACK", raising=False)
    process = train_in_process(capsys, *run_overrides(model_dir, tmp_path / "run"), "data.train_batch_size=0",
                               "rollout.n=-2", "algorithm.adv_estimator=ppo2", "actor.policy_loss=clipped",
                               "rollout.name=sglang")
    assert_refused(process, "invalid config (5 problems)", "data.train_batch_size=0: must be a positive number",
                   "rollout.n=-2", "algorithm.adv_estimator='ppo2': unknown", "actor.policy_loss='clipped': unknown",
                   "rollout.name='sglang': unknown")


def test_sizes_that_do_not_divide(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYBRIDRL_TRACEBACK", raising=False)
    process = train_in_process(capsys, *run_overrides(model_dir, tmp_path / "run"), "actor.ppo_mini_batch_size=3")
    assert_refused(process, "actor.ppo_mini_batch_size=3", "must divide data.train_batch_size=4")


def test_non_utf8_row_in_a_data_file(model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HYBRIDRL_TRACEBACK", raising=False)
    lines = [encoded(row) for row in good_rows()]
    lines[6] = lines[6].replace(b"6+1", b"6\xc3+1")
    data = jsonl_lines(tmp_path / "train.jsonl", lines)
    process = train_in_process(capsys, *run_overrides(model_dir, tmp_path / "run"), *train_files(data))
    assert_refused(process, "train.jsonl: row 6 (line 7) is not valid UTF-8", "HYBRIDRL_TRACEBACK=1")


def test_unreachable_ray_address(model_dir, tmp_path):
    process, seconds = hybridrl_train(*run_overrides(model_dir, tmp_path / "run"), "trainer.ray.address=127.0.0.1:9",
                                      "trainer.ray.num_cpus=null")
    assert_refused(process, "trainer.ray.address='127.0.0.1:9': nothing answers there")
    assert seconds < 90  # Ray alone would retry for minutes


@pytest.mark.distributed
def test_more_devices_than_the_cluster_has(model_dir, tmp_path):
    process, _ = hybridrl_train(*run_overrides(model_dir, tmp_path / "run"), "trainer.device=cpu",
                                "trainer.n_gpus_per_node=8", "trainer.ray.num_cpus=2", "data.train_batch_size=8",
                                "actor.ppo_mini_batch_size=8")
    assert_refused(process, "resource pool 'global': requested 8 CPUs", "cluster has 2 CPUs")


@pytest.mark.distributed
def test_a_rollout_pool_that_does_not_fit_beside_the_trainer(model_dir, tmp_path):
    """Either pool fits the cluster alone; together they do not: refused before either is placed (it was once
    refused after the rollout pool's placement timeout, 131 s)."""
    process, _ = hybridrl_train(*run_overrides(model_dir, tmp_path / "run"), "trainer.device=cpu",
                                "trainer.n_gpus_per_node=2", "trainer.ray.num_cpus=3", "rollout=vllm_cpu",
                                "rollout.n_gpus=2", "trainer.ray.placement_timeout_s=600")
    assert_refused(process, "resource pools 'global' 2 + 'rollout0' 1 + 'rollout1' 1 request 4 CPUs together",
                   "cluster has 3 CPUs")


@pytest.mark.distributed
@pytest.mark.long
def test_checkpoint_of_another_model(model_dir, tmp_path):
    run_dir = tmp_path / "run"
    manager = CheckpointManager(run_dir)
    manager.partial_dir(2)
    manager.commit(2, {"global_step": 2, "model_path": "/models/some-other-model"})
    process, _ = hybridrl_train(*run_overrides(model_dir, run_dir), "trainer.resume_mode=auto")
    assert_refused(process, "checkpoint", "global_step_2", "was trained from model.path='/models/some-other-model'")


@pytest.mark.distributed
@pytest.mark.long
def test_reward_function_that_always_raises(model_dir, tmp_path):
    path = reward_file(tmp_path / "broken_reward.py",
                       "def compute_score(data_source, solution, truth, extra):\n    return 1 / 0\n")
    process, _ = hybridrl_train(*run_overrides(model_dir, tmp_path / "run"), f"custom_reward_function.path={path}")
    assert_refused(process, "all 8 samples of the batch failed", "broken_reward.py",
                   "raised ZeroDivisionError: division by zero")
