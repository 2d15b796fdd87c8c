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
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from hybridrl.data.chat_roles import CHAT_ROLES, check_roles, template_source
from hybridrl.data.dataset import format_prompt, tokenize_prompts
from hybridrl.data.records import check_prompt
from hybridrl.protocol import Batch, Fields
from hybridrl.protocol.rollout_layout import assemble_rollout

__all__ = ["CHAT_ROLES", "SFTExample", "check_sft_lengths", "check_sft_roles", "sft_examples_from_rows",
           "encode_sft_examples"]

@dataclass(frozen=True)
class SFTExample:
    """One supervised pair: ``prompt`` (chat messages or text) and the exact target ``response`` text; ``where``
    names its file and row in errors (empty for a synthetic task's examples)."""

    prompt: Any
    response: str
    where: str = field(default="", compare=False)
    turns: tuple = ()
    """A multi-turn demonstration: the messages after the prompt (``assistant`` turns to learn, ``tool`` /
    environment turns to condition on), encoded by ``hybridrl.agents.conversation``; ``response`` is then the final
    turn's text. Empty for a single response."""


def sft_examples_from_rows(rows: Iterable[Mapping[str, Any]],
                           wheres: Optional[Sequence[str]] = None) -> list[SFTExample]:
    """One :class:`SFTExample` per row: its prompt (checked as RL prompts are: chat messages or text), and as the
    response ``extra_info.answer`` when the row carries a worked solution (GSM8K: it ends in ``#### N``, the format
    the reward pays for), else ``reward_model.ground_truth`` (synthetic tasks, whose ideal response is the bare
    answer). ``wheres`` labels each row in errors (``ValueError`` naming it)."""
    examples = []
    for index, row in enumerate(rows):
        where = wheres[index] if wheres is not None else f"SFT row {index}"
        extra = row.get("extra_info") or {}
        answer = extra.get("answer") if isinstance(extra, Mapping) else None
        reward_model = row.get("reward_model")
        target = answer if answer else (reward_model or {}).get("ground_truth") if isinstance(reward_model, Mapping) \
            else None
        if target is None or target == "":
            raise ValueError(f"{where}: not an SFT row: needs extra_info.answer or reward_model.ground_truth as the "
                             "target response")
        checked = check_prompt(row.get("prompt"), where)  # checked as RL prompts are
        prompt = checked if isinstance(checked, str) else row["prompt"]  # messages kept as written (extra keys too)
        examples.append(SFTExample(prompt, str(target), where))
    return examples


def check_sft_lengths(tokenizer: Any, examples: Sequence[SFTExample], max_response_length: int,
                      apply_chat_template: bool, max_prompt_length: int) -> None:
    """Refuse, before any step trains, an example whose prompt or target (with EOS) exceeds the limits or that the
    tokenizer cannot encode, naming its file and row (``ValueError``)."""
    for row, example in enumerate(examples):
        prompt_ids, target = _example_ids(tokenizer, example, apply_chat_template, row)
        _check_lengths(example, row, len(prompt_ids), len(target), max_prompt_length, max_response_length)


def check_sft_roles(tokenizer: Any, examples: Sequence[SFTExample], apply_chat_template: bool) -> None:
    """Refuse, before any step trains, a message whose role the chat template does not know, naming its file, row
    and role (``ValueError``; ``data/chat_roles.py``). Without the chat template roles are not rendered."""
    if not apply_chat_template:
        return
    template = template_source(tokenizer)
    for row, example in enumerate(examples):
        prompt = [] if isinstance(example.prompt, str) else example.prompt
        for key, listed in (("prompt", prompt), ("turns", example.turns)):
            check_roles(template, listed, example.where or f"SFT example {row}", key)


def encode_sft_examples(tokenizer: Any, examples: Sequence[SFTExample], max_response_length: int,
                        apply_chat_template: bool = True, max_prompt_length: int = 1 << 30) -> Batch:
    """SFT examples in the rollout layout, so the SFT loss runs through the same engine as RL.

    Returns:
        a :class:`~hybridrl.protocol.Batch` like a rollout's: ``prompts [B, P]`` (left-padded, exactly the ids a
        rollout prompt gets), ``responses``/``response_mask [B, R]`` (the target's tokens then EOS, right-padded to
        ``R = max_response_length``), ``input_ids``/``attention_mask [B, P + R]``.
    """
    if not examples:
        raise ValueError("no SFT examples to encode")
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token: SFT targets need one to end the response")
    encoded = [_example_ids(tokenizer, example, apply_chat_template, row) for row, example in enumerate(examples)]
    for row, (example, (prompt_ids, target)) in enumerate(zip(examples, encoded)):
        _check_lengths(example, row, len(prompt_ids), len(target), max_prompt_length, max_response_length)
    width = max(len(prompt_ids) for prompt_ids, _ in encoded)
    prompts = torch.full((len(examples), width), tokenizer.pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompts)
    responses = torch.full((len(examples), max_response_length), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros_like(responses)
    for row, (prompt_ids, target) in enumerate(encoded):
        prompts[row, width - len(prompt_ids):], prompt_mask[row, width - len(prompt_ids):] = torch.tensor(prompt_ids), 1
        responses[row, :len(target)], response_mask[row, :len(target)] = torch.tensor(target), 1
    prompt_batch = Batch(tensors={Fields.INPUT_IDS: prompts, Fields.ATTENTION_MASK: prompt_mask})
    return assemble_rollout(prompt_batch, 1, responses, response_mask, torch.zeros(responses.shape),
                            tokenizer.pad_token_id)


def _example_ids(tokenizer: Any, example: SFTExample, apply_chat_template: bool,
                 row: int) -> tuple[list[int], list[int]]:
    """``(prompt ids, target ids + EOS)`` of one example; the tokenizer's refusal named by the example's row."""
    try:
        prompt_ids = _prompt_ids(tokenizer, example.prompt, apply_chat_template)
        return prompt_ids, tokenizer(example.response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    except ValueError:
        raise
    except Exception as error:  # the tokenizers library's own exception types
        raise ValueError(f"{example.where or f'SFT example {row}'}: the tokenizer cannot encode this example "
                         f"({type(error).__name__}: {error})") from None


def _check_lengths(example: SFTExample, row: int, prompt_tokens: int, target_tokens: int, max_prompt_length: int,
                   max_response_length: int) -> None:
    where = example.where or f"SFT example {row}"
    if prompt_tokens > max_prompt_length:
        raise ValueError(f"{where}: prompt of {prompt_tokens} tokens exceeds data.max_prompt_length={max_prompt_length}")
    if target_tokens > max_response_length:
        raise ValueError(f"{where}: target of {target_tokens} tokens (with EOS) exceeds "
                         f"data.max_response_length={max_response_length}")


def _prompt_ids(tokenizer: Any, prompt: Any, apply_chat_template: bool) -> list[int]:
    text = format_prompt(prompt, tokenizer, apply_chat_template)
    return tokenize_prompts([text], tokenizer, apply_chat_template)[0]
