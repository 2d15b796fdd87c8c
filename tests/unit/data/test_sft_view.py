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
    batch = encode_sft_examples(char_tokenizer, examples)
    ids, attention, loss = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    assert ids.shape == attention.shape == loss.shape and ids.dtype == torch.long
    prompts = PromptDataset.from_rows(task.train_rows(8), char_tokenizer)
    for row, (example, prompt) in enumerate(zip(examples, prompts)):
        length = int(attention[row].sum())
        prompt_length = len(prompt.input_ids)
        assert ids[row, :prompt_length].tolist() == list(prompt.input_ids)  # the same tokens RL will see
        target = ids[row][loss[row].bool()].tolist()
        assert char_tokenizer.decode(target) == example.response + "<eos>"
        assert loss[row, :prompt_length].sum() == 0 and loss[row, length:].sum() == 0
        assert ids[row, length:].eq(char_tokenizer.pad_token_id).all()


def test_encoding_refuses_an_empty_list(char_tokenizer):
    with pytest.raises(ValueError, match="no SFT examples"):
        encode_sft_examples(char_tokenizer, [])
