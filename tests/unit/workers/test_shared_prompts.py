"""``model.share_prompts``: the responses to one prompt run as one row over a single copy of it, with the same
log-probs, entropies, values and gradients as padded rows — for every attention kernel that takes custom masks, both
architectures, a value head, uneven groups and empty responses — and only when it saves FLOPs."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForTokenClassification

from hybridrl.config.schema import ModelConfig
from hybridrl.protocol import Batch, Fields
from hybridrl.utils.tiny_model import TinyModelSpec, save_tiny_model
from hybridrl.engines.micro_batches import iterate_mini_batches
from hybridrl.modeling.model_builder import build_model
from hybridrl.modeling.sequences import response_log_probs, response_values
from hybridrl.modeling.shared_prompts import (attention_takes_custom_mask, group_rows, grouping_pays, prompt_groups,
                                             trim_padding)

PROMPT, RESPONSE = 7, 6


def grouped_batch(prompt_lengths, response_lengths, group_sizes, seed=0):
    """Rows whose consecutive runs of ``group_sizes`` share one prompt (left-padded to ``PROMPT``), responses of
    ``response_lengths`` (right-padded to ``RESPONSE``), plus two all-padding columns on each side."""
    generator = torch.Generator().manual_seed(seed)
    rows = sum(group_sizes)
    width = PROMPT + RESPONSE
    input_ids = torch.randint(4, 60, (rows, width), generator=generator)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    row = 0
    for group, size in enumerate(group_sizes):
        prompt = torch.randint(4, 60, (PROMPT,), generator=generator)
        for _ in range(size):
            input_ids[row, :PROMPT] = prompt
            attention_mask[row, PROMPT - prompt_lengths[group]:PROMPT + response_lengths[row]] = 1
            row += 1
    return input_ids * attention_mask, attention_mask


UNEVEN = dict(prompt_lengths=[4, 2, 5], response_lengths=[4, 1, 0, 3, 2, 4], group_sizes=[3, 1, 2])


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared")
    llama = save_tiny_model(root / "llama", TinyModelSpec(num_heads=4, num_kv_heads=2))
    qwen2 = save_tiny_model(root / "qwen2", TinyModelSpec(architecture="qwen2", num_heads=4, num_kv_heads=2))
    critic = AutoModelForTokenClassification.from_pretrained(llama, num_labels=1)
    critic.save_pretrained(root / "critic")
    return {"llama": str(llama), "qwen2": str(qwen2), "critic": str(root / "critic")}


def rows_seen(model):
    """Record the row count of every forward (a pre-hook on the input embedding)."""
    seen = []
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    return seen


def log_probs_and_grads(model, input_ids, attention_mask, share):
    model.zero_grad()
    log_probs, entropy = response_log_probs(model, input_ids, attention_mask, RESPONSE, with_entropy=True,
                                            entropy_grad=True, share_prompts=share)
    weights = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(1))
    ((log_probs * weights).sum() + entropy.sum()).backward()
    return log_probs.detach(), entropy.detach(), [parameter.grad.clone() for parameter in model.parameters()]


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
@pytest.mark.parametrize("attention", ["auto", "sdpa", "eager"])
def test_shared_prompts_equal_padded_rows(model_dirs, architecture, attention):
    model = build_model(ModelConfig(path=model_dirs[architecture], dtype="float32", attn_implementation=attention),
                        "actor")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    seen = rows_seen(model)
    padded = log_probs_and_grads(model, input_ids, attention_mask, share=False)
    shared = log_probs_and_grads(model, input_ids, attention_mask, share=True)
    assert seen == [6, 3]  # padded rows, then one row per prompt
    torch.testing.assert_close(shared[0], padded[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared[1], padded[1], atol=1e-5, rtol=1e-5)
    for got, want in zip(shared[2], padded[2]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    assert float(padded[2][0].abs().sum()) > 0
    assert (shared[0][2] == 0).all()  # the empty response scores nothing


def test_padded_rows_equal_a_plain_untrimmed_forward(model_dirs):
    """Dropping the all-padding columns changes nothing: compare with the model on the full rows, by hand."""
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32", attn_implementation="sdpa"), "actor")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    assert trim_padding(input_ids, attention_mask, RESPONSE).input_ids.shape[1] < input_ids.shape[1]
    positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        expected = logits[:, PROMPT - 1:-1].log_softmax(-1).gather(-1, input_ids[:, PROMPT:, None]).squeeze(-1)
        actual, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)
    valid = attention_mask[:, PROMPT:].bool()
    torch.testing.assert_close(actual[valid], expected[valid], atol=1e-5, rtol=1e-5)
    assert (actual[~valid] == 0).all()


def test_trimming_keeps_a_prompt_column_when_no_row_has_a_prompt(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    input_ids, attention_mask = grouped_batch([0, 0], [3, 5, 2, 6], [2, 2])
    assert trim_padding(input_ids, attention_mask, RESPONSE).prompt_width == 1
    with torch.no_grad():
        log_probs, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)
    assert log_probs.shape == (4, RESPONSE) and torch.isfinite(log_probs).all()
    assert (log_probs[attention_mask[:, PROMPT:] == 0] == 0).all()


def test_critic_values_equal_padded_rows(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["critic"], dtype="float32"), "critic")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    results = []
    for share in (False, True):
        model.zero_grad()
        values = response_values(model, input_ids, attention_mask, RESPONSE, share_prompts=share)
        values.pow(2).sum().backward()
        results.append((values.detach(), [parameter.grad.clone() for parameter in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for got, want in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_bf16_shared_prompts_stay_close_to_padded_rows(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="bfloat16"), "actor").to(torch.bfloat16)
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    with torch.no_grad():
        padded, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE)
        shared, _ = response_log_probs(model, input_ids, attention_mask, RESPONSE, share_prompts=True)
    torch.testing.assert_close(shared, padded, atol=0.05, rtol=0.02)


def test_group_rows_layout():
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    trimmed = trim_padding(input_ids, attention_mask, RESPONSE)
    assert (trimmed.prompt_width, trimmed.response_width) == (5, 4)
    groups = prompt_groups(trimmed)
    assert groups == [[0, 1, 2], [3], [4, 5]]
    layout = group_rows(trimmed, groups)
    assert layout.input_ids.shape == (3, 5 + 3 * 4)
    # rows 4 and 5 (group 2, slots 0 and 1): a prompt of 5 tokens, so their responses' positions start at 5
    assert layout.position_ids[2, 5:7].tolist() == [5, 6] and layout.position_ids[2, 9:13].tolist() == [5, 6, 7, 8]
    assert layout.input_ids[2, 9:13].tolist() == input_ids[5, PROMPT:PROMPT + 4].tolist()
    mask = layout.attention_mask[0, 0]
    slot_two_query = 5 + 2 * 4  # first column of slot 2 (an empty response: a pad query) sees the prompt and itself
    assert mask[slot_two_query].nonzero().flatten().tolist() == [1, 2, 3, 4, slot_two_query]
    assert mask[0].nonzero().flatten().tolist() == [0]  # a left-pad query: itself only, never an empty row
    first_of_slot_one = 5 + 4
    assert mask[first_of_slot_one].nonzero().flatten().tolist() == [1, 2, 3, 4, first_of_slot_one]
    assert layout.head_columns[0] == 4 and len(layout.head_columns) == 1 + 3 * 3
    assert len(layout.token_group) == int(attention_mask[:, PROMPT:].sum())


def test_grouping_is_used_only_when_it_saves_work(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    input_ids, attention_mask = grouped_batch(**UNEVEN)
    trimmed = trim_padding(input_ids, attention_mask, RESPONSE)
    assert grouping_pays(model, trimmed, prompt_groups(trimmed))
    distinct = grouped_batch([3] * 6, [2] * 6, [1] * 6)
    trimmed = trim_padding(*distinct, RESPONSE)
    assert not grouping_pays(model, trimmed, prompt_groups(trimmed))
    # long responses to short prompts: one row of 4 responses would hold 4x the score entries of the padded rows
    long_ids = torch.randint(4, 60, (4, 2 + 200))
    long_ids[:, :2] = long_ids[0, :2]
    trimmed = trim_padding(long_ids, torch.ones_like(long_ids), 200)
    assert not grouping_pays(model, trimmed, prompt_groups(trimmed))


def test_flash_and_flex_attention_keep_padded_rows(model_dirs):
    model = build_model(ModelConfig(path=model_dirs["llama"], dtype="float32"), "actor")
    assert attention_takes_custom_mask(model)
    for name in ("flash_attention_2", "flex_attention"):
        model.config._attn_implementation = name
        assert not attention_takes_custom_mask(model)


def test_shuffled_mini_batches_keep_each_prompts_rows_together():
    """After the sequence shuffle, rows of one prompt sit next to each other again inside each mini-batch, so
    micro-batches of ``n`` rows hold whole groups; which rows form which mini-batch does not change."""
    input_ids, attention_mask = grouped_batch([3, 5, 2, 4], [1] * 16, [4, 4, 4, 4])
    batch = Batch(tensors={Fields.INPUT_IDS: input_ids, Fields.ATTENTION_MASK: attention_mask,
                           Fields.RESPONSES: input_ids[:, PROMPT:], "row": torch.arange(16)})
    plain = iterate_mini_batches(batch, 8, epochs=2, shuffle=True, seed=3)
    grouped = iterate_mini_batches(batch, 8, epochs=2, shuffle=True, seed=3, group_prompts=True)
    for shuffled, together in zip(plain, grouped):
        assert sorted(shuffled["row"].tolist()) == sorted(together["row"].tolist())
        prompt_of = [row // 4 for row in together["row"].tolist()]
        runs = [prompt for index, prompt in enumerate(prompt_of) if index == 0 or prompt != prompt_of[index - 1]]
        assert len(runs) == len(set(prompt_of))  # each prompt one contiguous run
        assert len(set(prompt_of)) > 1 and [row // 4 for row in shuffled["row"].tolist()] != prompt_of
    unshuffled = iterate_mini_batches(batch, 8, epochs=1, shuffle=False, seed=0, group_prompts=True)
    assert unshuffled[0]["row"].tolist() == list(range(8))
