"""``hybridrl rm`` end to end on 2 CPU ranks (Ray + FSDP2): the demo's held-out accuracy rises, the exported reward
model scores like the trainer did, and a resumed run continues the same run."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hybridrl.config import load_config
from hybridrl.trainers.rm_trainer import RMTrainer, validation_metrics
from hybridrl.data.preference import PairFields, encode_pairs
from hybridrl.protocol import Batch
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics
from hybridrl.modeling.sequences import sequence_scores

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("rm_e2e") / "model")


def demo_config(model_dir, run_dir, steps, *extra):
    return load_config([f"model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
                        f"trainer.total_training_steps={steps}", "trainer.test_freq=6", "trainer.logger=[jsonl]",
                        "trainer.ray.num_cpus=4", *extra], "demo_rm")


@torch.no_grad()
def exported_accuracy(export_dir, trainer: RMTrainer) -> float:
    """Held-out accuracy of the exported directory under plain transformers (one padded forward per side)."""
    model = AutoModelForSequenceClassification.from_pretrained(export_dir, dtype=torch.float32).eval()
    pairs = encode_pairs(trainer.tokenizer, trainer.val_pairs, trainer.config.data.max_response_length)
    rewards = {side: sequence_scores(model, pairs[f"{side}_input_ids"], pairs[f"{side}_attention_mask"])
               for side in ("chosen", "rejected")}
    return validation_metrics(Batch(tensors={PairFields.CHOSEN_REWARDS: rewards["chosen"],
                                             PairFields.REJECTED_REWARDS: rewards["rejected"]}))["val/accuracy"]


def test_demo_accuracy_rises_and_the_export_scores_alike(model_dir, tmp_path):
    trainer = RMTrainer(demo_config(model_dir, tmp_path / "run", 12, "trainer.save_freq=6"))
    result = trainer.fit()
    (first_step, first), (last_step, last) = result.validations[0], result.validations[-1]
    assert (first_step, last_step) == (0, 12) and len(trainer.val_pairs) == 48
    assert first["val/accuracy"] <= 0.8 and last["val/accuracy"] >= 0.95, result.validations
    assert last["val/loss"] < first["val/loss"]
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows if "rm/loss" in row] == list(range(1, 13))
    assert all(row["rm/skipped_step"] == 0 and row["rm/grad_norm"] > 0 for row in rows if "rm/loss" in row)
    assert any("rm/grad_noise/b_simple" in row for row in rows)  # 2 ranks x 2 micro-batches per step
    assert exported_accuracy(result.export_dir, trainer) == pytest.approx(last["val/accuracy"])
    checkpoints = tmp_path / "run" / "checkpoints"
    assert all((checkpoints / f"global_step_{step}" / "reward_model" / "dcp" / ".metadata").is_file() for step in (6, 12))


@pytest.mark.long  # three whole runs (straight, stopped, resumed): 83 s inside the parallel suite (2026-12-02)
@pytest.mark.slow
def test_resume_continues_the_same_run(model_dir, tmp_path):
    straight = RMTrainer(demo_config(model_dir, tmp_path / "straight", 4, "trainer.val_before_train=false")).fit()
    first = RMTrainer(demo_config(model_dir, tmp_path / "resumed", 2, "trainer.save_freq=2",
                                  "trainer.val_before_train=false")).fit()
    assert first.global_step == 2
    resumed = RMTrainer(demo_config(model_dir, tmp_path / "resumed", 4, "trainer.val_before_train=false")).fit()
    assert [metrics["rm/loss"] for metrics in straight.history[2:]] == [m["rm/loss"] for m in resumed.history]
    assert straight.validations[-1][1] == resumed.validations[-1][1]
