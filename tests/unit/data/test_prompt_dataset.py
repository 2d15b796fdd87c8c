"""Tokenisation (chat template or plain text) and the over-long prompt policy (filter / error / left / right)."""

from __future__ import annotations

import logging

import pytest
from data_helpers import build_bpe_tokenizer, make_row

from hybridrl.data import PromptDataset, PromptOptions
from hybridrl.utils.tiny_model import build_char_tokenizer, encode_chat


def _dataset(rows, tokenizer, **options):
    return PromptDataset.from_rows(rows, tokenizer, PromptOptions(**options), source="test rows")


def test_chat_prompts_match_apply_chat_template(char_tokenizer):
    contents = ["2+3=", "17*4=", "what is 9-8?"]
    dataset = _dataset([make_row(content) for content in contents], char_tokenizer)
    expected = [char_tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False) for c in contents]
    assert [list(prompt.input_ids) for prompt in dataset] == expected
    assert [list(prompt.input_ids) for prompt in dataset] == encode_chat(char_tokenizer, contents)
    assert dataset[1].raw_prompt == "<|user|>17*4=<|assistant|>"


def test_plain_text_prompt_is_wrapped_as_a_user_message(char_tokenizer):
    chat, text = make_row("5+5="), make_row()
    text["prompt"] = "5+5="
    dataset = _dataset([chat, text], char_tokenizer)
    assert dataset[0].input_ids == dataset[1].input_ids


def test_without_chat_template_prompts_are_plain_text(char_tokenizer):
    text_row = make_row()
    text_row["prompt"] = "8+1="
    messages_row = make_row([{"role": "system", "content": "add"}, {"role": "user", "content": "8+1="}])
    dataset = _dataset([text_row, messages_row], char_tokenizer, apply_chat_template=False)
    assert dataset[0].raw_prompt == "8+1="
    assert dataset[1].raw_prompt == "add\n8+1="
    assert char_tokenizer.decode(dataset[0].input_ids) == "8+1="


def test_missing_chat_template_is_a_clear_error():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="apply_chat_template=true but the tokenizer .* has no chat template"):
        _dataset([make_row()], tokenizer)
    assert len(_dataset([make_row()], tokenizer, apply_chat_template=False)) == 1


def test_chat_template_failure_names_the_row():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{% if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif %}x"
    rows = [make_row(), make_row([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])]
    with pytest.raises(ValueError, match=r"test rows: row 1: the tokenizer's chat template failed: .*one message only"):
        _dataset(rows, tokenizer)


def test_filter_overlong_drops_and_reports(char_tokenizer, caplog):
    rows = [make_row("1+1="), make_row("123456789+987654321="), make_row("2+2=")]
    with caplog.at_level(logging.WARNING):
        dataset = _dataset(rows, char_tokenizer, max_prompt_length=8, filter_overlong_prompts=True)
    assert [prompt.ground_truth for prompt in dataset] == ["5", "5"]
    assert [prompt.row_id for prompt in dataset] == [0, 2]
    assert dataset.num_filtered == 1
    assert "dropped 1 of 3 prompts longer than data.max_prompt_length=8" in caplog.text


def test_truncation_error_names_row_and_length(char_tokenizer):
    rows = [make_row("1+1="), make_row("123456789+1=")]
    with pytest.raises(ValueError, match=r"test rows: row 1: the prompt is 14 tokens, longer than "
                                         r"data.max_prompt_length=8 \(data.truncation=error"):
        _dataset(rows, char_tokenizer, max_prompt_length=8, filter_overlong_prompts=False, truncation="error")


@pytest.mark.parametrize(("truncation", "kept"), [("left", "89+1=<|assistant|>"), ("right", "<|user|>12345")])
def test_left_and_right_truncation_keep_the_right_end(char_tokenizer, truncation, kept):
    dataset = _dataset([make_row("123456789+1=")], char_tokenizer, max_prompt_length=6,
                       filter_overlong_prompts=False, truncation=truncation)
    assert len(dataset[0].input_ids) == 6
    assert char_tokenizer.decode(dataset[0].input_ids) == kept
    assert dataset[0].raw_prompt == "<|user|>123456789+1=<|assistant|>"  # raw text stays untruncated


def test_everything_filtered_is_an_error(char_tokenizer):
    with pytest.raises(ValueError, match=r"every one of the 2 prompts .* longer than data.max_prompt_length=3"):
        _dataset([make_row(), make_row()], char_tokenizer, max_prompt_length=3)


@pytest.mark.parametrize(("key", "value"), [("truncation", "middle"), ("max_prompt_length", 0)])
def test_bad_options_name_the_key(key, value):
    with pytest.raises(ValueError, match=f"data.{key}"):
        PromptOptions(**{key: value})


def test_bpe_chat_template_has_exactly_one_bos_and_truncates_by_token():
    corpus = ["Natalia sold clips to 48 of her friends in April.", "[user] [assistant] How many clips?"] * 20
    tokenizer = build_bpe_tokenizer(corpus)
    bos = tokenizer.bos_token_id
    row = make_row("How many clips did Natalia sell in April?")
    chat = _dataset([row], tokenizer)[0]
    expected = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
    assert list(chat.input_ids) == list(expected)
    assert chat.input_ids.count(bos) == 1 and chat.input_ids[0] == bos  # the template's BOS, not a second one
    text_row = make_row()
    text_row["prompt"] = "How many clips?"
    plain = _dataset([text_row], tokenizer, apply_chat_template=False)[0]
    assert plain.input_ids[0] == bos and plain.input_ids.count(bos) == 1  # the post-processor's BOS
    assert len(plain.input_ids) < len("How many clips?")  # multi-character BPE tokens
    left = _dataset([row], tokenizer, max_prompt_length=4, filter_overlong_prompts=False, truncation="left")[0]
    assert left.input_ids == chat.input_ids[-4:]
