"""Whole GRPO runs with the anti-forgetting features on (PPO-ptx, EWC, prioritized prompt replay) and with LoRA,
on a tiny model through Ray + FSDP2 on 2 CPU ranks: metrics logged and finite, and exact resume still holds."""

from __future__ import annotations

import math

import pytest
import torch
from test_rl_trainer import COMPARED, final_weights, run_config

from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

ANTI_FORGETTING = ("actor.ptx.coef=0.5", "actor.ptx.batch_size=4", "actor.ewc.coef=10.0", "actor.ewc.fisher_batches=2",
                   "data.replay.enable=true", "data.replay.fraction=0.5", "data.replay.capacity=6")
LOGGED = ("actor/ptx/sft_loss", "actor/ewc/penalty", "replay/share", "replay/buffer_size")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("e2e_anti_forgetting") / "model")


@pytest.mark.long  # three whole runs (straight, stopped, resumed): 51-237 s inside the parallel suite
def test_ptx_ewc_and_replay_are_logged_and_resume_is_exact(model_dir, tmp_path):
    straight = tmp_path / "straight"
    RLTrainer(run_config(model_dir, straight, 4, *ANTI_FORGETTING)).fit()
    interrupted = tmp_path / "interrupted"
    RLTrainer(run_config(model_dir, interrupted, 2, *ANTI_FORGETTING)).fit()
    resumed = RLTrainer(run_config(model_dir, interrupted, 4, "trainer.resume_mode=auto", *ANTI_FORGETTING)).fit()
    assert resumed.global_step == 4

    rows, resumed_rows = read_metrics(straight), read_metrics(interrupted)
    assert [row["step"] for row in resumed_rows] == [1, 2, 3, 4]
    for row in rows:
        assert all(math.isfinite(row[key]) for key in LOGGED), row
    assert rows[0]["replay/share"] == 0.0 and all(row["replay/share"] == 0.5 for row in rows[1:])
    assert rows[0]["replay/buffer_size"] == 0 and all(0 < row["replay/buffer_size"] <= 6 for row in rows[1:])
    assert rows[0]["actor/ptx/sft_loss"] > 0 and rows[-1]["actor/ewc/penalty"] > 0  # moved away from the anchor
    for full, again in zip(rows, resumed_rows):
        for key in COMPARED + LOGGED:
            assert full[key] == again[key], (full["step"], key)  # bit for bit on CPU: buffer and EWC restored
    straight_weights, resumed_weights = final_weights(straight, 4), final_weights(interrupted, 4)
    for name in straight_weights:
        assert torch.equal(straight_weights[name], resumed_weights[name]), name


@pytest.mark.long  # a whole LoRA GRPO run with PTX + EWC: 146 s inside the parallel suite (2026-12-02)
def test_lora_grpo_run_with_anti_forgetting(model_dir, tmp_path):
    """A LoRA actor through the whole trainer: reference = adapters off (KL loss on), EWC over the adapters only."""
    run_dir = tmp_path / "lora"
    result = RLTrainer(run_config(model_dir, run_dir, 2, "model.lora.rank=4", "model.lora.alpha=8",
                                  "actor.optim.lr=1e-2", *ANTI_FORGETTING)).fit()
    assert result.global_step == 2
    rows = read_metrics(run_dir)
    for row in rows:
        assert all(math.isfinite(row[key]) for key in LOGGED + ("actor/pg_loss", "actor/kl_loss")), row
    assert rows[-1]["actor/kl_loss"] > 0  # the adapters moved the policy away from the base model
    # HF generate on the PEFT model (root params gathered around generate()) samples from the adapted policy
    assert all(row["rollout/log_prob_diff_max"] < 1e-4 for row in rows)
    weights = final_weights(run_dir, 2)
    assert weights and all("lora_" in name for name in weights)  # the checkpoint holds only the adapters
