"""The SFT trainer's and PPO-ptx's batches: step ``s`` encodes examples ``s·B .. s·B + B − 1`` of their source."""

from __future__ import annotations

import torch

from hybridrl.config import load_config
from hybridrl.config.sft_schema import SFTConfig, SFTDataConfig
from hybridrl.config.schema import ModelConfig
from hybridrl.trainers.continual import PtxBatches
from hybridrl.trainers.sft_trainer import SFTTrainer
from hybridrl.data import ArithmeticTask, encode_sft_examples, write_rows
from hybridrl.utils.seeding import derive_seed
from hybridrl.utils.tiny_model import save_tiny_model
from hybridrl.modeling.model_builder import load_tokenizer


def test_sft_trainer_batches_from_files_and_ptx_batches_from_the_task(tmp_path):
    model_dir = save_tiny_model(tmp_path / "model")
    tokenizer = load_tokenizer(ModelConfig(path=str(model_dir)))
    task = ArithmeticTask(seed=2, max_digits=1)
    rows = task.train_rows(5)
    write_rows(rows, tmp_path / "sft.jsonl")
    sft = SFTTrainer(SFTConfig(model=ModelConfig(path=str(model_dir)), data=SFTDataConfig(
        train_files=[str(tmp_path / "sft.jsonl")], train_batch_size=3, max_prompt_length=16, max_response_length=4)))
    expected = encode_sft_examples(tokenizer, task.sft_examples(5)[3:] + task.sft_examples(1), 4, max_prompt_length=16)
    assert torch.equal(sft.batch(1)["input_ids"], expected["input_ids"])  # rows 3, 4, then back to row 0

    config = load_config([f"model.path={model_dir}", "data.synthetic_task_kwargs={max_digits: 1}", "data.seed=2",
                          "actor.ptx.coef=0.5", "actor.ptx.batch_size=4"], check_paths=False)
    ptx = PtxBatches(config, tokenizer)
    stream = ArithmeticTask(seed=derive_seed(2, "ptx"), max_digits=1)  # its own stream, not the RL prompts'
    expected = encode_sft_examples(tokenizer, stream.sft_examples(4, start=8), config.data.max_response_length,
                                   max_prompt_length=config.data.max_prompt_length)
    batch = ptx.batch(2)
    assert torch.equal(batch["input_ids"], expected["input_ids"])
    assert torch.equal(batch["response_mask"], expected["response_mask"])
