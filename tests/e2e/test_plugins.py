"""``trainer.plugins``: a recipe file registers a rollout engine and an advantage estimator; the config accepts their
names only with the plugin, and a 2-step GRPO runs with both on 2 Ray workers (the workers load the plugin too)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

PLUGIN = Path(__file__).resolve().parents[2] / "recipes" / "plugin_example.py"
CHOICES = ["algorithm.adv_estimator=grpo_rank", "rollout.name=hf_capped"]


def hybridrl_config(*overrides: str) -> subprocess.CompletedProcess:
    """``hybridrl config <overrides>`` in a fresh process (this one may have loaded the plugin already)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "hybridrl.cli", "config", "--no-check-paths", *overrides],
                          capture_output=True, text=True, env=env, timeout=120)


def test_plugin_names_are_refused_without_the_plugin_and_accepted_with_it(capsys):
    from hybridrl.cli import main

    refused = hybridrl_config(*CHOICES)  # a fresh process: this one may have the plugin's names registered
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "algorithm.adv_estimator='grpo_rank': unknown" in refused.stderr
    assert "rollout.name='hf_capped': unknown" in refused.stderr
    assert main(["config", "--no-check-paths", f"trainer.plugins=[{PLUGIN.with_name('no_such_plugin.py')}]"]) == 2
    broken = capsys.readouterr().err
    assert "trainer.plugins=" in broken and "does not exist" in broken and "Traceback" not in broken
    assert main(["config", "--no-check-paths", *CHOICES, f"trainer.plugins=[{PLUGIN}]"]) == 0


def test_rank_advantages_against_a_hand_computed_group():
    from hybridrl.utils.user_files import import_user_file

    plugin = import_user_file(PLUGIN, "trainer.plugins")
    rewards = torch.zeros(5, 2)
    rewards[:, -1] = torch.tensor([3.0, 1.0, 1.0, 7.0, 2.0])
    mask = torch.ones(5, 2)
    mask[1, 1] = 0  # a response of one token: its reward still counts, on its valid token only
    rewards[1, 0], rewards[1, 1] = 1.0, 0.0
    advantages, _ = plugin.rank_advantages(token_level_rewards=rewards, response_mask=mask,
                                           index=["a", "a", "a", "a", "b"])
    # group a: scores 3, 1, 1, 7 -> ranks 2, 0.5, 0.5, 3 (mean 1.5) -> 2·(rank − 1.5)/3; group b alone -> 0
    expected = torch.tensor([1 / 3, -2 / 3, -2 / 3, 1.0, 0.0])
    assert torch.allclose(advantages[:, 0], expected)
    assert torch.equal(advantages[1, 1], torch.tensor(0.0)) and torch.allclose(advantages[[0, 2, 3], 1],
                                                                                 expected[[0, 2, 3]])


@pytest.mark.long  # a whole GRPO run: 73 s inside the parallel suite (2026-12-02)
def test_two_step_grpo_with_the_plugin_components(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    config = load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.ray.num_cpus=4", "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}",
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4",
        "actor.ppo_micro_batch_size_per_gpu=4", "data.max_response_length=5", f"trainer.plugins=[{PLUGIN}]",
        *CHOICES])
    result = RLTrainer(config).fit()
    assert result.global_step == 2
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["response_length/max"] <= 2  # hf_capped generated, in the worker processes
        assert -1.0 <= row["critic/advantages/min"] and row["critic/advantages/max"] <= 1.0  # ranks, not z-scores
        assert row["actor/grad_norm"] > 0 or row["critic/advantages/max"] == 0
