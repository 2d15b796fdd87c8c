"""Preference rows → pairs (errors name file and row), the hashed held-out split, pair encoding, synthetic pairs."""

from __future__ import annotations

import json

import pytest
import torch

from hybridrl.data import ArithmeticTask
from hybridrl.data.io import write_rows
from hybridrl.data.preference import (
    PairFields,
    PreferencePair,
    check_pair_lengths,
    encode_pairs,
    read_preference_pairs,
    split_held_out,
)
from hybridrl.data.synthetic_preference import synthetic_pairs

CHAT = [{"role": "user", "content": "2+2="}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_pairs_and_ranked_rows_from_parquet_and_jsonl(tmp_path):
    parquet = write_rows([{"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": 0.5}],
                         tmp_path / "pairs.parquet")
    jsonl = write_jsonl(tmp_path / "ranked.jsonl", [{"prompt": CHAT, "responses": ["4", "5", "22"]}])
    pairs = read_preference_pairs([str(parquet), jsonl])
    assert pairs[0] == PreferencePair("1+1=", "2", "3", 0.5, pairs[0].where)
    assert [(p.chosen, p.rejected) for p in pairs[1:]] == [("4", "5"), ("4", "22"), ("5", "22")]  # all ordered pairs
    assert all(p.prompt == CHAT and p.margin == 0.0 for p in pairs[1:])


@pytest.mark.parametrize(("row", "phrase"), [
    ({"chosen": "a", "rejected": "b"}, "missing column 'prompt'"),
    ({"prompt": "p", "chosen": "a"}, r"missing column\(s\) \['rejected'\]"),
    ({"prompt": "p", "chosen": "a", "rejected": "a"}, "identical"),
    ({"prompt": "p", "chosen": 4, "rejected": "a"}, "'chosen' must be chat messages or text"),
    ({"prompt": "p", "chosen": "a", "rejected": "b", "margin": "big"}, "'margin' must be a number"),
    ({"prompt": "p", "responses": ["only one"]}, "at least 2 strings"),
    ({"prompt": "p", "responses": ["a", "b", "a"]}, "same text twice"),
    ({"prompt": "", "chosen": "a", "rejected": "b"}, "'prompt' is empty"),
    ({"prompt": "p", "chosen": "a", "rejected": "  "}, "'rejected' is empty: a pair needs a response on each side"),
    ({"prompt": "p", "responses": ["a", ""]}, r"responses\[1\]: 'response' is empty"),
])
def test_bad_rows_name_file_and_row(tmp_path, row, phrase):
    good = {"prompt": "p", "chosen": "a", "rejected": "b"}
    path = write_jsonl(tmp_path / "prefs.jsonl", [good, row])
    with pytest.raises(ValueError, match=phrase) as error:
        read_preference_pairs([path])
    assert "prefs.jsonl: row 1 (line 2)" in str(error.value)


def test_held_out_split_keeps_every_prompt_on_one_side():
    pairs = [PreferencePair(f"{i % 40}+1=", "a", f"b{i}") for i in range(400)]
    train, held_out = split_held_out(pairs, 0.25)
    assert len(train) + len(held_out) == 400 and 0.1 < len(held_out) / 400 < 0.4
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert split_held_out(pairs, 0.25) == (train, held_out)  # a fixed hash, not a random draw


def test_encoding_puts_both_sides_of_a_pair_on_one_row(char_tokenizer):
    pairs = [PreferencePair(CHAT, "4", "17", 1.0), PreferencePair("12+30=", "42", "4")]
    batch = encode_pairs(char_tokenizer, pairs, max_response_length=5)
    assert len(batch) == 2 and batch[PairFields.MARGIN].tolist() == [1.0, 0.0]
    assert batch[PairFields.CHOSEN_INPUT_IDS].shape == batch[PairFields.REJECTED_INPUT_IDS].shape
    for row, pair in enumerate(pairs):
        for side in ("chosen", "rejected"):
            ids = batch[f"{side}_input_ids"][row][batch[f"{side}_attention_mask"][row].bool()]
            prompt = pair.prompt if isinstance(pair.prompt, str) else pair.prompt[0]["content"]
            assert char_tokenizer.decode(ids) == f"<|user|>{prompt}<|assistant|>{getattr(pair, side)}<eos>"


def test_length_check_names_the_row(char_tokenizer):
    pairs = [PreferencePair("1+1=", "2", "3", where="a.jsonl: row 0"),
             PreferencePair("1+1=", "2", "123456", where="a.jsonl: row 1")]
    check_pair_lengths(char_tokenizer, pairs[:1], 16, 4, True)
    with pytest.raises(ValueError, match=r"a.jsonl: row 1: 'rejected' of 7 tokens \(with EOS\) exceeds data.max_response_length=4"):
        check_pair_lengths(char_tokenizer, pairs, 16, 4, True)
    with pytest.raises(ValueError, match=r"a.jsonl: row 0: prompt of \d+ tokens exceeds data.max_prompt_length=3"):
        check_pair_lengths(char_tokenizer, pairs, 3, 8, True)


def test_synthetic_pairs_prefer_the_right_answer_or_the_shorter_one():
    rows = ArithmeticTask(seed=3, operators="+").train_rows(50)
    correct = synthetic_pairs(rows, "correct", seed=1, spread=4)
    for row, pair in zip(rows, correct):
        answer = int(row["reward_model"]["ground_truth"])
        assert pair.prompt == row["prompt"] and pair.chosen == str(answer)
        assert int(pair.rejected) != answer and abs(int(pair.rejected) - answer) <= 4 and int(pair.rejected) >= 0
    shorter = synthetic_pairs(rows, "shorter", seed=1, spread=3)
    assert all(p.rejected.startswith(p.chosen) and 1 <= len(p.rejected) - len(p.chosen) <= 3 for p in shorter)
    assert synthetic_pairs(rows, "correct", seed=1, spread=4) == correct
    with pytest.raises(ValueError, match="synthetic_preference='longer'"):
        synthetic_pairs(rows, "longer", seed=1)


def test_pair_margins_are_float_tensors(char_tokenizer):
    batch = encode_pairs(char_tokenizer, [PreferencePair("1+1=", "2", "3", 2)], max_response_length=3)
    assert batch[PairFields.MARGIN].dtype == torch.float32


USER, YES, NO = {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, \
    {"role": "assistant", "content": "5"}


def test_trls_conversational_layouts_read_with_an_explicit_or_an_implicit_prompt(tmp_path):
    """TRL's preference data: sides as messages ending in the reply, the prompt in its own column or shared before
    the replies; both give the same pair."""
    path = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": [USER], "chosen": [YES], "rejected": [NO]},
                                                  {"chosen": [USER, YES], "rejected": [USER, NO], "margin": 0.5},
                                                  {"prompt": "2+2?", "chosen": [YES], "rejected": [NO]}])
    pairs = read_preference_pairs([path])
    assert [(p.prompt, p.chosen, p.rejected, p.margin) for p in pairs] == [([USER], "4", "5", 0.0),
                                                                          ([USER], "4", "5", 0.5),
                                                                          ([USER], "4", "5", 0.0)]


@pytest.mark.parametrize(("row", "phrase"), [
    ({"chosen": [USER, YES], "rejected": [{"role": "user", "content": "3+3?"}, NO]}, "differ before their last reply"),
    ({"chosen": [YES], "rejected": [NO]}, "no 'prompt' column, and 'chosen' holds only the reply"),
    ({"prompt": [USER], "chosen": [YES, USER], "rejected": [NO]}, "'chosen' must end with the assistant's reply"),
    ({"prompt": [USER], "chosen": [{"role": "assistant", "content": " "}], "rejected": [NO]}, "is empty"),
    ({"prompt": [USER], "chosen": [YES], "rejected": [YES]}, "identical"),
])
def test_bad_conversational_rows_name_file_and_row(tmp_path, row, phrase):
    path = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": [USER], "chosen": [YES], "rejected": [NO]}, row])
    with pytest.raises(ValueError, match=phrase) as error:
        read_preference_pairs([path])
    assert "prefs.jsonl: row 1 (line 2)" in str(error.value)
