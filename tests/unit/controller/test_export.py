"""``hybridrl export``: a checkpoint written by the workers' own save path becomes an HF directory that plain
transformers loads with the same weights and logits; anything that is not a complete checkpoint is refused clearly."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridrl.cli import main
from hybridrl.config.schema import ModelConfig, OptimConfig
from hybridrl.trainers.checkpoints import TRAINER_STATE, CheckpointManager, write_manifest
from hybridrl.utils.tiny_model import TinyModelSpec, encode_chat, save_tiny_model
from hybridrl.engines.checkpoint import save_sharded
from hybridrl.modeling.model_builder import build_model
from hybridrl.engines.optim import build_optimizer, build_scheduler


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("export") / "model")


def write_checkpoint(run_dir, model_path, step=3):
    """A run's checkpoint as the trainer writes it, with weights that differ from ``model_path``'s (one Adam step)."""
    # sdpa, as the exported model loads in transformers: the logits below are compared bit for bit
    model = build_model(ModelConfig(path=str(model_path), attn_implementation="sdpa"), "actor")
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    scheduler = build_scheduler(optimizer, OptimConfig(lr=1e-2), total_steps=10)
    ids = torch.arange(1, 9).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    manager = CheckpointManager(run_dir)
    save_sharded(manager.partial_dir(step) / "actor", model, optimizer, scheduler)
    manager.commit(step, {"global_step": step, "model_path": str(model_path)})
    return model.eval()


def test_export_of_a_run_directory_loads_in_transformers_with_identical_logits(model_dir, tmp_path, capsys):
    trained = write_checkpoint(tmp_path / "run", model_dir)
    out = tmp_path / "hf"
    assert main(["export", str(tmp_path / "run"), str(out)]) == 0
    assert "global_step_3" in capsys.readouterr().out
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert exported.config.use_cache  # the training-time use_cache=False is not exported
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor(encode_chat(tokenizer, ["12+34="]))
    with torch.no_grad():
        logits = exported(input_ids=ids).logits
        assert torch.equal(logits, trained(input_ids=ids).logits)
        assert not torch.allclose(logits, base(input_ids=ids).logits)  # the trained weights, not the base model's
    for name, tensor in trained.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name


def test_export_accepts_the_checkpoint_directory_itself(model_dir, tmp_path):
    write_checkpoint(tmp_path / "run", model_dir, step=5)
    assert main(["export", str(tmp_path / "run" / "checkpoints" / "global_step_5"), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").is_file()


def test_export_refuses_what_is_not_a_complete_checkpoint(model_dir, tmp_path, capsys):
    def refused(source, out=tmp_path / "out") -> str:
        assert main(["export", str(source), str(out)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return err

    assert "does not exist" in refused(tmp_path / "missing")
    assert "neither a hybridrl run directory" in refused(model_dir)
    manager = CheckpointManager(tmp_path / "crashed")
    partial = manager.partial_dir(2)  # a crash during the first checkpoint write
    assert "no complete checkpoint" in refused(tmp_path / "crashed")
    assert "half-written checkpoint" in refused(partial)
    write_checkpoint(tmp_path / "run", model_dir)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert "not empty" in refused(tmp_path / "run", tmp_path / "full")
    other = save_tiny_model(tmp_path / "other", TinyModelSpec(hidden_size=96, num_heads=3, num_kv_heads=1))
    state = tmp_path / "run" / "checkpoints" / "global_step_3" / TRAINER_STATE
    torch.save({"global_step": 3, "model_path": str(other)}, state)  # the shards do not fit the named model
    write_manifest(state.parent)  # a checkpoint written so, not damaged afterwards
    assert "cannot load the actor shards" in refused(tmp_path / "run")
