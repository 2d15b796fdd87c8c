"""Bad input is refused before any worker starts, with one error naming the key, file or row (docs/troubleshooting.md).

Every case builds real files (data, model directories, reward code, checkpoints) and goes through the real entry
point: ``RLTrainer(load_config(overrides))`` — config validation, tokenizer, datasets and reward loading — and must
fail within seconds with a ``ValueError`` (``ConfigError`` included) whose message holds the given phrases.
The config-value cases (sizes, ranges, choices) are catalogued in ``tests/unit/config/test_validation.py``.
"""

from __future__ import annotations

import time

import pytest
import torch

from bad_input_cases import (copy_model, empty_parquet, encoded, good_rows, jsonl_lines, model_without_chat_template,
                             parquet_without_column, reward_file, run_overrides, train_files)

from hybridrl.config import load_config
from hybridrl.trainers.checkpoints import CheckpointManager
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.data.io import write_rows
from hybridrl.utils.tiny_model import save_tiny_model

SECONDS = 20.0  # "never a hang": every refusal comes well within this on a loaded 2-core machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("reliability") / "model")


def _jsonl(tmp, rows, name="train.jsonl"):
    return write_rows(rows, tmp / name)


# ---- each builder returns (overrides, phrases the message must contain) ----------------------------------------
def data_file_missing(tmp, model):
    return train_files(tmp / "nope.jsonl"), ["data.train_files", "nope.jsonl", "does not exist"]


def data_file_wrong_suffix(tmp, model):
    (tmp / "train.csv").write_text("prompt\n1+1\n")
    return train_files(tmp / "train.csv"), ["data.train_files", "train.csv", "unsupported format"]


def jsonl_empty(tmp, model):
    (tmp / "train.jsonl").write_text("\n\n")
    return train_files(tmp / "train.jsonl"), ["train.jsonl", "is empty (no rows)"]


def parquet_empty(tmp, model):
    return train_files(empty_parquet(tmp / "train.parquet")), ["train.parquet", "is empty (no rows)"]


def parquet_not_parquet(tmp, model):
    (tmp / "train.parquet").write_bytes(b"this is not parquet")
    return train_files(tmp / "train.parquet"), ["train.parquet", "not a readable parquet file"]


def parquet_missing_column(tmp, model):
    path = parquet_without_column(tmp / "train.parquet", "reward_model")
    return train_files(path), ["train.parquet", "missing column(s) ['reward_model']"]


def jsonl_row_missing_key(tmp, model):
    rows = good_rows()
    del rows[3]["reward_model"]
    return train_files(_jsonl(tmp, rows)), ["train.jsonl: row 3", "missing column(s) ['reward_model']"]


def jsonl_empty_prompt(tmp, model):
    rows = good_rows()
    rows[2]["prompt"] = [{"role": "user", "content": "  "}]
    return train_files(_jsonl(tmp, rows)), ["train.jsonl: row 2", "'prompt' is empty"]


def jsonl_prompt_too_long(tmp, model):
    rows = good_rows()
    rows[5]["prompt"] = "1+1 " * 40
    return (train_files(_jsonl(tmp, rows)) + ["data.truncation=error", "data.filter_overlong_prompts=false"],
            ["train.jsonl: row 5", "longer than data.max_prompt_length=32", "data.truncation=error"])


def jsonl_not_utf8(tmp, model):
    lines = [encoded(row) for row in good_rows()]
    lines[1] = lines[1].replace(b"1+1=?", b"1+1=\xff?")
    return train_files(jsonl_lines(tmp / "train.jsonl", lines)), ["train.jsonl: row 1 (line 2)", "not valid UTF-8"]


def jsonl_not_json(tmp, model):
    lines = [encoded(row) for row in good_rows()]
    lines[4] = b'{"data_source": "arithmetic", '
    return train_files(jsonl_lines(tmp / "train.jsonl", lines)), ["train.jsonl: row 4 (line 5)", "not valid JSON"]


def jsonl_fewer_rows_than_a_batch(tmp, model):
    return train_files(_jsonl(tmp, good_rows(2))), ["2 prompts", "fewer than one batch of 4 (data.train_batch_size)"]


def jsonl_unknown_data_source(tmp, model):
    rows = good_rows()
    rows[6]["data_source"] = "my_new_task"
    return train_files(_jsonl(tmp, rows)), ["data_source='my_new_task'", "custom_reward_function.path"]


def val_file_bad_row(tmp, model):
    rows = good_rows()
    rows[1]["prompt"] = []
    val = _jsonl(tmp, rows, "val.jsonl")
    return train_files(_jsonl(tmp, good_rows())) + [f"data.val_files=[{val}]"], ["val.jsonl: row 1", "empty list of messages"]


def model_path_missing(tmp, model):
    return [f"model.path={tmp / 'no_model'}"], ["model.path", "does not exist"]


def model_dir_without_config(tmp, model):
    return [f"model.path={copy_model(model, tmp / 'm', drop=('config.json',))}"], ["model.path", "no config.json"]


def model_config_not_json(tmp, model):
    copy_model(model, tmp / "m")
    (tmp / "m" / "config.json").write_text("{garbage")
    return [f"model.path={tmp / 'm'}"], ["model.path", "config.json is not valid JSON"]


def model_without_weights(tmp, model):
    return [f"model.path={copy_model(model, tmp / 'm', drop=('model.safetensors',))}"], ["model.path", "no weights"]


def model_without_tokenizer(tmp, model):
    path = copy_model(model, tmp / "m", drop=("tokenizer.json", "tokenizer_config.json"))
    return [f"model.path={path}"], ["model.path", "holds no tokenizer", "model.tokenizer_path"]


def tokenizer_without_chat_template(tmp, model):
    path = model_without_chat_template(model, tmp / "m")
    return [f"model.path={path}"], ["data.apply_chat_template=true", "no chat template"]


def float16_on_cpu(tmp, model):
    return ["trainer.device=cpu", "model.dtype=float16"], ["model.dtype='float16'", "not supported on CPU"]


def cuda_without_gpu(tmp, model):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    return ["trainer.device=cuda"], ["trainer.device='cuda'", "no CUDA device is visible"]


def nccl_channel_to_colocated_replicas(tmp, model):
    return (["trainer.device=cuda", "rollout.name=vllm", "rollout.engine_process=own",
             "rollout.weight_transfer=collective"],
            ["rollout.weight_transfer='collective'", "NCCL, which cannot join an actor rank and a replica"])


def reward_path_missing(tmp, model):
    return [f"custom_reward_function.path={tmp / 'reward.py'}"], ["custom_reward_function.path", "existing .py file"]


def reward_name_missing(tmp, model):
    path = reward_file(tmp / "reward.py", "def score(a, b, c, d):\n    return 1.0\n")
    return ([f"custom_reward_function.path={path}", "custom_reward_function.name=compute_score"],
            ["custom_reward_function.name='compute_score'", "reward.py", "['score']"])


def reward_file_fails_to_import(tmp, model):
    path = reward_file(tmp / "reward.py", "import not_a_module_anywhere\n")
    return [f"custom_reward_function.path={path}"], ["custom_reward_function.path", "importing it failed"]


def reward_wrong_signature(tmp, model):
    path = reward_file(tmp / "reward.py", "def compute_score(text):\n    return 1.0\n")
    return [f"custom_reward_function.path={path}"], ["custom_reward_function.name='compute_score'", "4 positional"]


def resume_path_missing(tmp, model):
    return (["trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp / 'ckpt'}"],
            ["trainer.resume_from_path", "is not a directory"])


def resume_path_not_a_checkpoint(tmp, model):
    (tmp / "ckpt").mkdir()
    return (["trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp / 'ckpt'}"],
            ["trainer.resume_from_path", "not a hybridrl checkpoint"])


CASES = [data_file_missing, data_file_wrong_suffix, jsonl_empty, parquet_empty, parquet_not_parquet,
         parquet_missing_column, jsonl_row_missing_key, jsonl_empty_prompt, jsonl_prompt_too_long, jsonl_not_utf8,
         jsonl_not_json, jsonl_fewer_rows_than_a_batch, jsonl_unknown_data_source, val_file_bad_row,
         model_path_missing, model_dir_without_config, model_config_not_json, model_without_weights,
         model_without_tokenizer, tokenizer_without_chat_template, float16_on_cpu, cuda_without_gpu,
         nccl_channel_to_colocated_replicas,
         reward_path_missing, reward_name_missing, reward_file_fails_to_import, reward_wrong_signature,
         resume_path_missing, resume_path_not_a_checkpoint]


@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
def test_bad_input_is_refused_with_a_clear_error(case, model_dir, tmp_path):
    overrides, phrases = case(tmp_path, model_dir)
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", *overrides)))
    message = str(caught.value)
    for phrase in phrases:
        assert phrase in message, message
    assert "Traceback" not in message
    assert time.monotonic() - started < SECONDS


def test_a_good_file_passes_the_same_checks(model_dir, tmp_path):
    """The builders' good rows are accepted: the cases above fail for the reason they name, not another."""
    trainer = RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", *train_files(_jsonl(tmp_path, good_rows())))))
    assert len(trainer.loaders.train.dataset) == 8


def test_a_committed_checkpoint_passes_resume_path_validation(model_dir, tmp_path):
    """``resume_path_not_a_checkpoint`` fails for the missing trainer state, not for any directory."""
    manager = CheckpointManager(tmp_path / "other_run")
    manager.partial_dir(3)
    checkpoint = manager.commit(3, {"global_step": 3, "model_path": str(model_dir)})
    overrides = ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"]
    assert RLTrainer(load_config(run_overrides(model_dir, tmp_path / "run", *overrides))).global_step == 0
