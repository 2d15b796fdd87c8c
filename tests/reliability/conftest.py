"""Shared set-up of the reliability tests: a tiny model and one uninterrupted tiny GRPO run to compare against."""

from __future__ import annotations

import pytest
from reliability_helpers import overrides
from shared_ray import shared_ray_runtime

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model


@pytest.fixture(autouse=True)
def _shared_ray():
    """In-process runs attach to the process's shared Ray instance (``tests/shared_ray.py``); CLI runs in subprocesses
    start their own, as a user's would."""
    shared_ray_runtime()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("reliability") / "model")


@pytest.fixture(scope="session")
def straight_run(model_dir, tmp_path_factory):
    """The reference: the run without any fault (and with ``trainer.export_at_end``), in this process."""
    run_dir = tmp_path_factory.mktemp("straight") / "run"
    shared_ray_runtime()
    result = RLTrainer(load_config(overrides(model_dir, run_dir, "trainer.export_at_end=true"))).fit()
    assert result.global_step == 3 and result.export_dir == run_dir / "hf"
    return run_dir
