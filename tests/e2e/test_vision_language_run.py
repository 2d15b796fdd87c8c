"""Vision-language GRPO through the whole stack: a tiny random Qwen2-VL (built with its own AutoModelFor… class),
the synthetic ``shapes`` image task, HF rollout, FSDP2 on 2 CPU ranks. The images reach generation and every trainer
forward: the trainer's log-probs of the sampled tokens equal the engine's (a forward without the images would be off
by 1e-3 and more, ``tests/unit/modeling/test_multimodal.py``). With ``actor.freeze_vision_tower`` the exported
policy keeps the vision tower's starting weights while the language model's move, and the export carries the image
processor, so it reads images as the model it came from — and ``hybridrl eval`` of the run reads them too."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_vlm import save_tiny_vlm
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


@pytest.fixture(scope="module")
def vision_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("vision_run")
    model_dir = save_tiny_vlm(tmp_path / "model")
    config = load_config([
        f"model.path={model_dir}", "model.dtype=float32", f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.val_before_train=true",
        "trainer.save_at_end=false", "trainer.export_at_end=true", "trainer.ray.num_cpus=4",
        "trainer.n_gpus_per_node=2", "rollout.name=hf", "data.synthetic_task=shapes",
        "data.synthetic_task_kwargs={num_val: 8}", "data.max_response_length=6", "data.max_prompt_length=64",
        "data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size_per_gpu=2",
        "actor.old_log_prob=recompute", "algorithm=grpo", "actor.optim.lr=1e-2", "model.use_remove_padding=true",
        "actor.freeze_vision_tower=true"])
    return tmp_path, model_dir, RLTrainer(config).fit()


def test_images_reach_generation_and_training_and_a_frozen_tower_stays(vision_run):
    tmp_path, model_dir, result = vision_run
    rows = [row for row in read_metrics(tmp_path / "run") if "actor/pg_loss" in row]
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/log_prob_diff_max"] < 1e-4, row["rollout/log_prob_diff_max"]
    assert "val/shapes/accuracy" in result.first_validation
    before = load_file(model_dir / "model.safetensors")
    after = load_file(result.export_dir / "model.safetensors")
    # saved in Qwen2-VL's checkpoint layout: the tower under visual., the language model under model.
    vision = [name for name in before if name.startswith("visual.")]
    language = [name for name in before if name.startswith("model.layers.")]
    assert vision and language
    assert all(torch.equal(after[name], before[name]) for name in vision)
    assert any(not torch.equal(after[name], before[name]) for name in language)
    assert (result.export_dir / "preprocessor_config.json").is_file()


@pytest.mark.long
def test_eval_of_the_run_reads_the_images(vision_run, capsys):
    """`hybridrl eval` reads the held-out drawings with the run's image processor."""
    tmp_path, _, _ = vision_run
    assert main(["eval", str(tmp_path / "run"), "--limit", "4", "--output", str(tmp_path / "eval")]) == 0
    out = capsys.readouterr().out
    assert "shapes" in out and "pass@1" in out
