"""The SFT view of the arithmetic task: responses are exactly the answers; encoding masks all but response + EOS."""

from __future__ import annotations

import pytest
import torch

from hybridrl.data import ArithmeticTask, PromptDataset, encode_sft_examples


def test_sft_examples_pair_prompts_with_exact_answers():
    task = ArithmeticTask(seed=6)
    examples = task.sft_examples(20)
    rows = task.train_rows(20)
    assert [example.prompt for example in examples] == [row["prompt"] for row in rows]
    assert [example.response for example in examples] == [row["reward_model"]["ground_truth"] for row in rows]


def test_encoding_matches_the_rl_prompt_and_masks_the_response(char_tokenizer):
    task = ArithmeticTask(seed=6, operators="+*")
    examples = task.sft_examples(8)
    batch = encode_sft_examples(char_tokenizer, examples, max_response_length=8)
    prompt_ids, prompt_mask = batch["prompts"], batch["attention_mask"][:, :batch["prompts"].shape[1]]
    assert batch["responses"].shape == batch["response_mask"].shape == (8, 8)
    assert torch.equal(batch["input_ids"][:, -8:], batch["responses"])
    prompts = PromptDataset.from_rows(task.train_rows(8), char_tokenizer)
    for row, (example, prompt) in enumerate(zip(examples, prompts)):
        assert prompt_ids[row][prompt_mask[row].bool()].tolist() == list(prompt.input_ids)  # what RL will see
        target = batch["responses"][row][batch["response_mask"][row].bool()].tolist()
        assert char_tokenizer.decode(target) == example.response + "<eos>"


def test_encoding_refuses_targets_and_prompts_that_do_not_fit(char_tokenizer):
    examples = ArithmeticTask(seed=6).sft_examples(2)
    with pytest.raises(ValueError, match="max_response_length=1"):
        encode_sft_examples(char_tokenizer, examples, max_response_length=1)
    with pytest.raises(ValueError, match="max_prompt_length=2"):
        encode_sft_examples(char_tokenizer, examples, max_response_length=8, max_prompt_length=2)


def test_encoding_refuses_an_empty_list(char_tokenizer):
    with pytest.raises(ValueError, match="no SFT examples"):
        encode_sft_examples(char_tokenizer, [], max_response_length=4)
