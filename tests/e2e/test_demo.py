"""The main job's code path (`make demo`): base model → SFT → GRPO → summary and plot, shrunk to seconds."""

from __future__ import annotations

import math

import pytest

from hybridrl.demo import run_demo
from hybridrl.utils.tiny_model import TinyModelSpec
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.long]  # make demo / demo-agent's code path


def test_demo_runs_sft_then_grpo_and_reports_held_out_accuracy(tmp_path, capsys):
    small = TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128)
    figures = run_demo(["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.ray.num_cpus=4",
                        "data.synthetic_task_kwargs.num_val=16"],
                       tmp_path, sft_overrides=["trainer.total_training_steps=3", "trainer.ray.num_cpus=4"],
                       model_spec=small)
    assert (tmp_path / "sft" / "hf" / "config.json").is_file()         # the SFT export GRPO starts from
    assert figures["plot"].is_file() and figures["plot"].stat().st_size > 0
    for key in ("accuracy_after_sft", "accuracy_after_rl"):
        assert 0.0 <= figures[key] <= 1.0 and not math.isnan(figures[key])
    steps = [row["step"] for row in read_metrics(figures["run_dir"])]
    assert [step for step in steps if step > 0] == [1, 2]      # step 0: validation before training
    printed = capsys.readouterr().out
    assert "held-out accuracy after SFT" in printed and "step time breakdown" in printed


def test_agent_demo_runs_sft_on_demonstrations_then_multi_turn_grpo(tmp_path, capsys):
    """`make demo-agent`'s path: multi-turn SFT, then GRPO whose rollouts are agent-loop episodes; the agent metrics
    are logged and observation tokens never carry loss (response_mask 0 where the tool answered)."""
    from hybridrl.demo import AGENT

    small = TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128)
    figures = run_demo(["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.ray.num_cpus=4",
                        "data.synthetic_task_kwargs.num_val=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=16"],
                       tmp_path, sft_overrides=["trainer.total_training_steps=2", "trainer.ray.num_cpus=4"],
                       model_spec=small, demo=AGENT)
    rows = [row for row in read_metrics(figures["run_dir"]) if row["step"] > 0]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:
        assert row["agent/turns"] >= 1 and row["agent/env_failures"] == 0 and row["agent/prefix_mismatches"] == 0
    printed = capsys.readouterr().out
    assert "hybridrl demo-agent" in printed and "tool calls per episode" in printed


def test_vision_demo_runs_the_format_lesson_then_grpo_on_images(tmp_path, capsys):
    """`make demo-vlm`'s path: a tiny random Qwen2-VL, the text-only format lesson (SFT), then GRPO on the shapes
    task's images; the export between the stages carries the image processor."""
    from hybridrl.demo import VISION

    figures = run_demo(["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.ray.num_cpus=4",
                        "data.synthetic_task_kwargs.num_val=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                        "actor.ppo_micro_batch_size_per_gpu=16"],
                       tmp_path, sft_overrides=["trainer.total_training_steps=2", "trainer.ray.num_cpus=4"], demo=VISION)
    assert (tmp_path / "sft" / "hf" / "preprocessor_config.json").is_file()
    assert [row["step"] for row in read_metrics(figures["run_dir"]) if row["step"] > 0] == [1, 2]
    assert 0.0 <= figures["accuracy_after_rl"] <= 1.0
    assert "hybridrl demo-vlm" in capsys.readouterr().out
