"""Bad input, round 4: a setting or data that the chosen mode cannot use is refused by name before any worker
starts, instead of being accepted without a word: KTO data of one label only (it learns no preference and reports a
reward gap of 0), reference log-probs asked of a loss that has no reference (SimPO, ORPO)."""

from __future__ import annotations

import json

import pytest

from hybridrl.cli import main
from hybridrl.config import load_config
from hybridrl.trainers.dpo_trainer import DPOTrainer
from hybridrl.utils.tiny_model import save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("round4") / "model")


@pytest.mark.parametrize("label", [True, False])
def test_kto_data_of_one_label_is_refused_naming_the_files(model_dir, tmp_path, label):
    rows = tmp_path / "kto.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{n}+1=", "completion": str(n + 1), "label": label}) + "\n"
                            for n in range(8)))
    config = load_config([f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}", "loss.type=kto",
                          "data.synthetic_task=null", f"data.train_files=[{rows}]"], "demo_dpo")
    kind = "desirable" if label else "undesirable"
    with pytest.raises(ValueError, match=rf"data.train_files: all \d+ completions are {kind}: KTO weighs desirable"):
        DPOTrainer(config)


@pytest.mark.parametrize("loss", ["simpo", "orpo"])
def test_reference_log_probs_on_the_fly_for_a_loss_without_a_reference_is_refused(model_dir, loss, capsys):
    assert main(["dpo", "--no-check-paths", "--config-name", "demo_dpo", f"model.path={model_dir}",
                 f"loss.type={loss}", "loss.reference_log_probs=on_the_fly"]) == 2
    message = capsys.readouterr().err
    assert "loss.reference_log_probs='on_the_fly'" in message and f"loss.type={loss} uses no reference" in message
    assert "Traceback" not in message


def test_a_teacher_with_fewer_positions_than_a_sequence_is_refused_like_the_policy(model_dir, tmp_path):
    """The teacher scores whole prompt + response sequences: a shorter context than they need was accepted for the
    teacher, though the same mismatch on the policy was refused."""
    from hybridrl.utils.tiny_model import TinyModelSpec

    teacher = save_tiny_model(tmp_path / "teacher", TinyModelSpec(max_position_embeddings=32))
    overrides = [f"model.path={model_dir}", "rollout=hf", "trainer.device=cpu",
                 f"algorithm.distillation.teacher_path={teacher}", "data.max_prompt_length=32",
                 "data.max_response_length=16"]
    with pytest.raises(ValueError) as refused:
        load_config(overrides)
    assert "algorithm.distillation.teacher_path=" in str(refused.value)
    assert "the teacher has 32 positions" in str(refused.value) and "= 48 tokens" in str(refused.value)
    load_config([*overrides[:-2], "data.max_prompt_length=16", "data.max_response_length=16"])  # 32 fit


def test_an_async_checkpoint_resumed_in_sync_mode_is_refused_before_workers_start(model_dir, tmp_path):
    """A ``one_step_off`` checkpoint holds step 2's batch, generated with step 1's weights; resumed with
    ``async_training.mode=sync`` (staleness 0) it raised ``StalenessBoundError`` mid-run, a traceback after the
    workers started. Now one message names both settings, before Ray starts."""
    import torch

    from hybridrl.protocol import Batch, Fields
    from hybridrl.protocol.state import batch_state
    from hybridrl.trainers.checkpoints import CheckpointManager
    from hybridrl.trainers.rl_trainer import RLTrainer

    run_dir = tmp_path / "run"
    manager = CheckpointManager(run_dir)
    manager.partial_dir(1)
    rows = Batch(tensors={Fields.POLICY_VERSION: torch.tensor([1, 1])})
    manager.commit(1, {"global_step": 1, "model_path": str(model_dir),
                       "rollout_queue": {"next_step": 3, "batches": [{"step": 2, "prompt_uids": ["a"],
                                                                      "rows": batch_state(rows)}]}})
    config = load_config([f"model.path={model_dir}", f"trainer.default_local_dir={run_dir}", "rollout=hf",
                          "trainer.resume_mode=auto", "trainer.total_training_steps=3", "data.train_batch_size=4",
                          "rollout.n=2", "actor.ppo_mini_batch_size=2", "actor.ppo_micro_batch_size_per_gpu=2"])
    assert config.async_training.mode == "sync"
    with pytest.raises(ValueError) as refused:
        RLTrainer(config).fit()
    message = str(refused.value)
    assert "holds the batch of step 2, generated ahead with the weights of step 1 (staleness 1)" in message
    assert "async_training.mode=sync allows staleness <= 0" in message and "trainer.resume_mode=disable" in message
