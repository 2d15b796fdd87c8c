"""A supervised (SFT) view of prompt rows: (prompt, target response) pairs, encoded for a warm-start loss.

For tasks whose ground truth *is* the ideal response (the synthetic ``arithmetic`` task: ``"23+45="`` → ``"68"``),
a few SFT steps teach a randomly initialised tiny model the response format before RL, so RL starts from a
non-zero reward.

Encoding mirrors what RL will see: the prompt is formatted exactly like a rollout prompt (chat template with the
generation prompt), and the response is the target's tokens followed by EOS — the tokens the policy must learn to
emit and then stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridrl.data.dataset import format_prompt, tokenize_prompts
from hybridrl.protocol import Batch

__all__ = ["SFTExample", "sft_examples_from_rows", "encode_sft_examples"]


@dataclass(frozen=True)
class SFTExample:
    """One supervised pair: ``prompt`` (chat messages or text) and the exact target ``response`` text."""

    prompt: Any
    response: str


def sft_examples_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[SFTExample]:
    """One :class:`SFTExample` per row: its prompt, and its ``reward_model.ground_truth`` as the response."""
    return [SFTExample(row["prompt"], str(row["reward_model"]["ground_truth"])) for row in rows]


def encode_sft_examples(tokenizer: Any, examples: Sequence[SFTExample], *, apply_chat_template: bool = True) -> Batch:
    """Token tensors for a next-token loss on the responses only.

    Returns:
        a :class:`~hybridrl.protocol.Batch` with ``input_ids`` ``[B, T]`` (prompt + response + EOS, right-padded
        with the pad token), ``attention_mask`` ``[B, T]`` and ``loss_mask`` ``[B, T]`` (1 on the response and EOS
        tokens: the positions whose token the model must predict), all int64.
    """
    if not examples:
        raise ValueError("no SFT examples to encode")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token: SFT targets need one to end the response")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sequences, response_starts = [], []
    for example in examples:
        prompt_ids = _prompt_ids(tokenizer, example.prompt, apply_chat_template)
        response_ids = tokenizer(example.response, add_special_tokens=False)["input_ids"]
        sequences.append([*prompt_ids, *response_ids, tokenizer.eos_token_id])
        response_starts.append(len(prompt_ids))
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    loss_mask = torch.zeros_like(input_ids)
    for row, (sequence, start) in enumerate(zip(sequences, response_starts)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
        loss_mask[row, start : len(sequence)] = 1
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask})


def _prompt_ids(tokenizer: Any, prompt: Any, apply_chat_template: bool) -> list[int]:
    text = format_prompt(prompt, tokenizer, apply_chat_template)
    return tokenize_prompts([text], tokenizer, apply_chat_template)[0]
