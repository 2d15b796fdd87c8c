"""Builders of bad inputs for the reliability tier: data files, model directories, reward files, checkpoints.

Each builder writes real files under a temporary directory and returns the config overrides that point a run at them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hybridrl.data.io import write_rows

# A small GRPO run on the tiny model (the same shape as the e2e tests), refused or started by the cases below.
RUN_OVERRIDES = (
    "model.dtype=float32", "trainer.total_training_steps=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
    "trainer.ray.num_cpus=4", "data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=2",
    "actor.ppo_micro_batch_size_per_gpu=2", "data.max_response_length=3", "data.max_prompt_length=32",
    "data.synthetic_task_kwargs={max_digits: 1, operators: '+', num_val: 8}", "trainer.save_at_end=false",
)


def run_overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"model.path={model_dir}", f"trainer.default_local_dir={run_dir}", *RUN_OVERRIDES, *extra]


def good_row(index: int) -> dict:
    return {"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{index}+1=?"}],
            "reward_model": {"ground_truth": str(index + 1)}}


def good_rows(count: int = 8) -> list[dict]:
    return [good_row(index) for index in range(count)]


def train_files(*paths: Path) -> list[str]:
    return ["data.synthetic_task=null", f"data.train_files=[{','.join(str(path) for path in paths)}]"]


def jsonl_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def encoded(row: dict) -> bytes:
    return json.dumps(row).encode()


def copy_model(model_dir: Path, target: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """A copy of the tiny model directory without the files named in ``drop``."""
    shutil.copytree(model_dir, target)
    for name in drop:
        (target / name).unlink()
    return target


def model_without_chat_template(model_dir: Path, target: Path) -> Path:
    copy_model(model_dir, target)
    for template in target.glob("chat_template*"):
        template.unlink()
    config_path = target / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config.pop("chat_template", None)
    config_path.write_text(json.dumps(tokenizer_config))
    return target


def empty_parquet(path: Path) -> Path:
    schema = pa.schema([("data_source", pa.string()), ("prompt", pa.string()), ("reward_model", pa.string())])
    pq.write_table(schema.empty_table(), path)
    return path


def parquet_without_column(path: Path, column: str) -> Path:
    return write_rows([{key: value for key, value in row.items() if key != column} for row in good_rows()], path)


def reward_file(path: Path, body: str) -> Path:
    path.write_text(body)
    return path
