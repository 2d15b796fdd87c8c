"""Problems the trainer can see before starting any worker are refused at construction, naming the culprit."""

from __future__ import annotations

import json

import pytest

from hybridrl.config import load_config
from hybridrl.trainers.rl_trainer import RLTrainer
from hybridrl.utils.tiny_model import save_tiny_model


def test_unknown_data_source_is_refused_before_any_generation(tmp_path):
    rows = [{"data_source": "my_private_task", "prompt": [{"role": "user", "content": f"{i}+1="}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(8)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = load_config([f"model.path={save_tiny_model(tmp_path / 'model')}", "data.synthetic_task=null",
                          f"data.train_files=[{train}]", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
                          "data.max_prompt_length=16"])
    with pytest.raises(ValueError, match="no reward function for data_source='my_private_task'"):
        RLTrainer(config)
