"""``hybridrl dpo`` end to end on 2 CPU ranks (Ray + FSDP2): on the demo's pairs the held-out preference accuracy
rises and the loss falls; the exported policy ranks the held-out pairs as the trainer did; reference log-probs
scored up front or step by step give the same run; SimPO runs without a reference; the CLI prints its summary and
refuses bad keys with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridrl.config import load_config
from hybridrl.data.preference import PairFields
from hybridrl.engines.preference_losses import pair_log_probs
from hybridrl.trainers.dpo_trainer import DPOTrainer
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.utils.tracking import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("dpo_e2e") / "model")


def demo_config(model_dir, run_dir, steps, *extra):
    return load_config([f"model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
                        f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.ray.num_cpus=4",
                        *extra], "demo_dpo")


@torch.no_grad()
def exported_accuracy(export_dir, trainer: DPOTrainer) -> float:
    """Held-out accuracy of the exported policy under plain transformers, against the reference's log-probs."""
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    pairs = trainer.val_batch()
    policy = pair_log_probs(model, pairs, trainer.config.data.max_response_length, packed=False)
    margin = ((policy.chosen - pairs[PairFields.REFERENCE_CHOSEN_LOG_PROBS])
              - (policy.rejected - pairs[PairFields.REFERENCE_REJECTED_LOG_PROBS]))
    return float((margin > 0).float().mean())


def test_demo_accuracy_rises_and_the_export_ranks_alike(model_dir, tmp_path):
    trainer = DPOTrainer(demo_config(model_dir, tmp_path / "run", 20))
    result = trainer.fit()
    (first_step, first), (last_step, last) = result.validations[0], result.validations[-1]
    assert (first_step, last_step) == (0, 20) and len(trainer.val_pairs) == 48
    assert first["val/accuracy"] == 0.0 and first["val/loss"] == pytest.approx(0.6931, abs=1e-4)  # policy = reference
    assert last["val/accuracy"] >= 0.9 and last["val/loss"] < first["val/loss"] - 0.1, result.validations
    rows = [row for row in read_metrics(tmp_path / "run") if "dpo/loss" in row]
    assert [row["step"] for row in rows] == list(range(1, 21))
    assert all(row["dpo/skipped_step"] == 0 and row["dpo/grad_norm"] > 0 for row in rows)
    assert exported_accuracy(result.export_dir, trainer) == pytest.approx(last["val/accuracy"])


@pytest.mark.long  # 34-88 s of the parallel suite, whose 15 minutes it outgrew on a slower VM (2026-12-06)
def test_kto_on_the_demo_pairs_unpaired_ranks_desirable_rows_first(model_dir, tmp_path):
    """KTO: the demo's pairs as labelled rows (a desirable and an undesirable completion each); held-out AUROC of
    the implicit rewards rises from 0 (all rewards 0 at the start: no pair ranked) and z₀ is logged each step."""
    trainer = DPOTrainer(demo_config(model_dir, tmp_path / "run", 20, "loss.type=kto"))
    assert sum(pair.desirable for pair in trainer.train_pairs) * 2 == len(trainer.train_pairs)  # each pair: 1 + 1
    result = trainer.fit()
    (_, first), (_, last) = result.validations[0], result.validations[-1]
    assert first["val/accuracy"] == 0.0 and first["val/loss"] == pytest.approx(0.5, abs=1e-6)  # 1 − σ(0) per row
    assert last["val/accuracy"] >= 0.9 and last["val/loss"] < first["val/loss"], result.validations
    rows = [row for row in read_metrics(tmp_path / "run") if "dpo/loss" in row]
    assert len(rows) == 20 and all(row["dpo/reference_point"] >= 0 for row in rows)


@pytest.mark.long  # a whole run or two each; the demo test above stays in `make test`
def test_reference_scored_up_front_or_step_by_step_gives_the_same_run(model_dir, tmp_path):
    runs = {}
    for mode in ("precompute", "on_the_fly"):
        DPOTrainer(demo_config(model_dir, tmp_path / mode, 2, f"loss.reference_log_probs={mode}",
                               "trainer.val_before_train=false")).fit()
        runs[mode] = [row for row in read_metrics(tmp_path / mode) if "dpo/loss" in row]
    for first, second in zip(runs["precompute"], runs["on_the_fly"]):
        for key in ("dpo/loss", "dpo/margin", "dpo/grad_norm", "val/loss"):
            if key in first:
                assert first[key] == pytest.approx(second[key], rel=1e-6), key


@pytest.mark.long  # a whole run or two each; the demo test above stays in `make test`
@pytest.mark.parametrize("loss", ["simpo", "orpo"])
def test_reference_free_losses_train_without_a_reference(model_dir, tmp_path, loss):
    """SimPO and ORPO build no reference; a checkpoint of the run exports (``hybridrl export``) as the run did."""
    from safetensors.torch import load_file

    from hybridrl.trainers.export import export_checkpoint

    trainer = DPOTrainer(demo_config(model_dir, tmp_path / "run", 2, f"loss.type={loss}", "loss.beta=2.0",
                                     "trainer.save_freq=2"))
    result = trainer.fit()
    assert trainer._reference == {"train": None, "val": None}
    assert result.global_step == 2 and "val/accuracy" in result.validations[-1][1]
    exported = export_checkpoint(tmp_path / "run", tmp_path / "exported")
    ours, theirs = load_file(exported / "model.safetensors"), load_file(result.export_dir / "model.safetensors")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
    if loss == "orpo":  # its likelihood term, a share of the step's chosen tokens, summed back to the step's mean
        rows = [row for row in read_metrics(tmp_path / "run") if "dpo/nll" in row]
        assert len(rows) == 2 and all(0 < row["dpo/nll"] < row["dpo/loss"] for row in rows)


def cli(*arguments):
    return subprocess.run([sys.executable, "-m", "hybridrl.cli", "dpo", "--config-name", "demo_dpo", *arguments],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.long  # a whole run or two each; the demo test above stays in `make test`
def test_the_cli_runs_and_refuses_bad_keys(model_dir, tmp_path, capsys, monkeypatch):
    """One whole run through the console script; the refusals (before any worker) through its main, here."""
    from hybridrl.cli import main

    done = cli(f"model.path={model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
               "trainer.total_training_steps=1", "trainer.ray.num_cpus=4")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "hybridrl dpo: 1 steps; held-out accuracy 0.000 (step 0) -> " in done.stdout
    monkeypatch.delenv("HYBRIDRL_TRACEBACK", raising=False)
    unlabelled = tmp_path / "kto.jsonl"  # a KTO row without its label: the file and row named, exit 2
    unlabelled.write_text('{"prompt": "1+1=", "completion": "2", "label": true}\n{"prompt": "2+2=", "completion": "4"}\n')
    for overrides, phrases in ((["loss.beta=0"], ["loss.beta"]),
                               (["loss.type=ipo", "loss.label_smoothing=0.1"], ["loss.label_smoothing"]),
                               (["loss.desirable_weight=2"], ["loss.desirable_weight"]),
                               (["loss.type=kto", "loss.undesirable_weight=0"], ["loss.undesirable_weight"]),
                               (["loss.type=kto", "data.synthetic_task=null", f"data.train_files=[{unlabelled}]"],
                                ["kto.jsonl: row 1 (line 2)", "'label'"])):
        capsys.readouterr()
        assert main(["dpo", "--config-name", "demo_dpo", f"model.path={model_dir}", *overrides]) == 2, overrides
        refused = capsys.readouterr().err
        assert all(phrase in refused for phrase in phrases) and "Traceback" not in refused, (overrides, refused)


@pytest.mark.long  # a whole run or two each; the demo test above stays in `make test`
def test_with_lora_the_reference_is_the_base_model_with_adapters_off(model_dir, tmp_path):
    """No second model: the reference log-probs come from the policy with its adapters disabled — at the start the
    adapters are zero, so every pair's implicit reward is 0 (loss log 2); training moves them."""
    trainer = DPOTrainer(demo_config(model_dir, tmp_path / "run", 4, "model.lora.rank=8", "model.lora.alpha=16",
                                     "optim.lr=1e-2", "trainer.test_freq=4"))
    result = trainer.fit()
    (_, first), (_, last) = result.validations[0], result.validations[-1]
    assert first["val/loss"] == pytest.approx(0.6931, abs=1e-4) and first["val/margin"] == pytest.approx(0, abs=1e-5)
    assert last["val/loss"] < first["val/loss"] and trainer._reference["train"] is not None
