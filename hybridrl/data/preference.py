"""Preference pairs for reward-model and preference training (``hybridrl rm``, ``hybridrl dpo``): rows → typed pairs
(with errors naming file and row) → a pair Batch.

A row (parquet or JSONL) is either one pair, or several responses ranked best first (every ordered pair is used)::

    {"prompt": [{"role": "user", "content": "..."}], "chosen": "...", "rejected": "...", "margin": 1.0}
    {"prompt": "plain text prompt", "responses": ["best", "middle", "worst"]}          # 3 pairs

``prompt`` is chat messages or text (as in the RL rows); ``margin`` is optional (reward units, default 0). TRL's
conversational layouts are read too: ``chosen`` / ``rejected`` as messages ending in the assistant's reply, with a
``prompt`` column or without one (the messages both sides share before their replies are the prompt)::

    {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
     "rejected": [{"role": "assistant", "content": "5"}]}
    {"chosen": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
     "rejected": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "5"}]}

Encoding mirrors what the reward model will score inside RL: the prompt formatted like a rollout prompt (chat template
with the generation prompt), then the response's tokens and EOS. A pair Batch has one **row per pair** — chosen and
rejected side by side — so DP and micro-batch splits never separate the two sides of a pair:

- ``chosen_input_ids``, ``chosen_attention_mask``, ``rejected_input_ids``, ``rejected_attention_mask``: ``[B, P + R]``
  (prompt left-padded to ``P``, response right-padded to ``R = max_response_length``; both sides share ``P`` and ``R``);
- ``margin``: ``[B]`` float.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hybridrl.data.dataset import format_prompt, tokenize_prompts
from hybridrl.data.io import SourceRow, read_rows
from hybridrl.data.records import _check_text, check_prompt
from hybridrl.data.sft import SFTExample, encode_sft_examples
from hybridrl.protocol import Batch, Fields

__all__ = ["PairFields", "PreferencePair", "pairs_from_rows", "read_preference_pairs", "split_held_out",
           "check_pair_lengths", "encode_pairs"]


class PairFields:
    """Field names of a pair Batch (see the module docstring for shapes)."""

    CHOSEN_INPUT_IDS = "chosen_input_ids"
    CHOSEN_ATTENTION_MASK = "chosen_attention_mask"
    REJECTED_INPUT_IDS = "rejected_input_ids"
    REJECTED_ATTENTION_MASK = "rejected_attention_mask"
    MARGIN = "margin"
    CHOSEN_REWARDS = "chosen_rewards"
    REJECTED_REWARDS = "rejected_rewards"
    CHOSEN_LOG_PROBS = "chosen_log_probs"
    REJECTED_LOG_PROBS = "rejected_log_probs"
    REFERENCE_CHOSEN_LOG_PROBS = "reference_chosen_log_probs"
    REFERENCE_REJECTED_LOG_PROBS = "reference_rejected_log_probs"
    """``[B]`` summed response log-probs (nats) of a side, under the policy / the frozen reference policy."""
    STEP_CHOSEN_TOKENS = "step_chosen_tokens"
    """``[B]``, the same in every row: the chosen responses' tokens in the whole optimizer step (ORPO's likelihood
    term is a mean over them: its normaliser, as the pair count is the other terms')."""
    DESIRABLE = "desirable"
    """KTO (``hybridrl.data.unpaired``): ``[B]`` 1.0 where the row's completion (its ``chosen`` side) is desirable,
    0.0 where it is undesirable; the ``rejected`` side is the row's KL completion (another prompt's completion)."""
    STEP_LABEL_COUNTS = "step_label_counts"
    """KTO: ``[B, 2]``, the same in every row: the step's desirable and undesirable row counts (the normalisers of the
    mean implicit reward of each label, so those metrics add up over micro-batches and ranks)."""
    STEP_KL = "step_kl"
    """KTO: ``[B]``, the same in every row: the reference point ``z₀``, the whole optimizer step's detached estimate
    of KL(π‖π_ref) from its rows' KL sides (the mean of policy − reference log-probs, at least 0)."""


@dataclass(frozen=True)
class PreferencePair:
    """One comparison: ``chosen`` is preferred to ``rejected`` as a response to ``prompt`` (messages or text)."""

    prompt: Any
    chosen: str
    rejected: str
    margin: float = 0.0
    where: str = "<memory>"

    def prompt_key(self) -> str:
        """A stable text key of the prompt (pairs of one prompt share it; the held-out split is by prompt)."""
        return prompt_key(self.prompt)


def prompt_key(prompt: Any) -> str:
    """A stable text key of a prompt (messages or text)."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{message['role']}:{message['content']}" for message in prompt)


def _response(row: Mapping[str, Any], key: str, where: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise ValueError(f"{where}: '{key}' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{where}: '{key}' is empty: a pair needs a response on each side")
    _check_text(value, where, key)
    return value


def pairs_from_row(source: SourceRow) -> list[PreferencePair]:
    """The pairs of one row: ``chosen``/``rejected`` (+ optional ``margin``), or ranked ``responses``; conversational
    sides (TRL's layouts) are read by :func:`_conversational_pair`."""
    row, where = source.row, source.where
    if not all(isinstance(row.get(key, ""), str) for key in ("chosen", "rejected")):
        return [_conversational_pair(row, where)]
    if "prompt" not in row:
        raise ValueError(f"{where}: missing column 'prompt' (columns: {sorted(row)})")
    prompt = check_prompt(row["prompt"], where, "prompt")
    if "responses" in row:
        responses = row["responses"]
        if isinstance(responses, str) or not isinstance(responses, Sequence) or len(responses) < 2:
            raise ValueError(f"{where}: 'responses' must be a list of at least 2 strings ranked best first")
        texts = [_response({"response": text}, "response", f"{where}: responses[{index}]")
                 for index, text in enumerate(responses)]
        if len(set(texts)) != len(texts):
            raise ValueError(f"{where}: 'responses' holds the same text twice: a tie carries no preference")
        return [PreferencePair(prompt, texts[i], texts[j], 0.0, f"{where} (responses {i} > {j})")
                for i, j in itertools.combinations(range(len(texts)), 2)]
    missing = [key for key in ("chosen", "rejected") if key not in row]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}: a row needs 'chosen' and 'rejected', or a ranked "
                         f"'responses' list (columns: {sorted(row)})")
    chosen, rejected = _response(row, "chosen", where), _response(row, "rejected", where)
    return [_checked_pair(prompt, chosen, rejected, row, where)]


def _conversational_pair(row: Mapping[str, Any], where: str) -> PreferencePair:
    """TRL's conversational layouts: ``chosen`` and ``rejected`` are messages ending in the assistant's reply, with
    the prompt in ``prompt`` (messages) or, without that column, the messages the two sides share before their
    replies (TRL's implicit prompt). Messages before a reply are the same on both sides, or the row is refused."""
    missing = [key for key in ("chosen", "rejected") if key not in row]
    if missing:
        raise ValueError(f"{where}: missing column(s) {missing}: a row needs 'chosen' and 'rejected' "
                         f"(columns: {sorted(row)})")
    sides = {}
    for key in ("chosen", "rejected"):
        messages = check_prompt(row[key], where, key)
        if isinstance(messages, str) or messages[-1]["role"] != "assistant":
            raise ValueError(f"{where}: '{key}' must end with the assistant's reply (messages, as TRL's "
                             "conversational preference data), or both sides must be text")
        sides[key] = (messages[:-1], _response(messages[-1], "content", f"{where}: {key}[-1]"))
    (chosen_context, chosen), (rejected_context, rejected) = sides["chosen"], sides["rejected"]
    if chosen_context != rejected_context:
        raise ValueError(f"{where}: 'chosen' and 'rejected' differ before their last reply; only the reply may "
                         "differ (the messages before it are the prompt)")
    if "prompt" in row:
        given = check_prompt(row["prompt"], where, "prompt")
        prompt = [*([{"role": "user", "content": given}] if isinstance(given, str) else given), *chosen_context]
    elif chosen_context:
        prompt = chosen_context
    else:
        raise ValueError(f"{where}: no 'prompt' column, and 'chosen' holds only the reply: give the prompt")
    return _checked_pair(prompt, chosen, rejected, row, where)


def _checked_pair(prompt: Any, chosen: str, rejected: str, row: Mapping[str, Any], where: str) -> PreferencePair:
    """The pair, with the row's ``margin`` (0 when absent or null); refused when the two replies are the same."""
    if chosen == rejected:
        raise ValueError(f"{where}: 'chosen' and 'rejected' are identical: the pair carries no preference")
    margin = row.get("margin", 0.0)
    if margin is None:
        margin = 0.0
    if isinstance(margin, bool) or not isinstance(margin, (int, float)):
        raise ValueError(f"{where}: 'margin' must be a number, got {type(margin).__name__}")
    if not math.isfinite(margin):  # it enters the loss: every step would be non-finite and skipped
        raise ValueError(f"{where}: 'margin' must be a finite number, got {margin}")
    return PreferencePair(prompt, chosen, rejected, float(margin), where)


def pairs_from_rows(rows: Iterable[SourceRow]) -> list[PreferencePair]:
    """Every pair of ``rows``, in row order."""
    return [pair for source in rows for pair in pairs_from_row(source)]


def read_preference_pairs(paths: Sequence[str]) -> list[PreferencePair]:
    """All pairs of the parquet/JSONL files ``paths``; an error names the file and row of any bad row."""
    pairs = [pair for path in paths for pair in pairs_from_rows(read_rows(path).rows)]
    if not pairs:
        raise ValueError(f"no preference pairs in {list(paths)}")
    return pairs


def split_held_out(pairs: Sequence[PreferencePair], fraction: float,
                   salt: str = "hybridrl/preference/split/v1") -> tuple[list[PreferencePair], list[PreferencePair]]:
    """``(train, held_out)``: a fixed hash of each prompt puts about ``fraction`` of the prompts (with all their pairs)
    in the held-out split, so no prompt is in both."""
    train, held_out = [], []
    for pair in pairs:
        digest = hashlib.sha256(f"{salt}:{pair.prompt_key()}".encode()).digest()
        (held_out if int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction else train).append(pair)
    return train, held_out


def check_pair_lengths(tokenizer: Any, pairs: Sequence[PreferencePair], max_prompt_length: int,
                       max_response_length: int, apply_chat_template: bool) -> None:
    """Raise a ``ValueError`` naming the row of the first pair whose prompt or response (with EOS) is too long."""
    for pair in pairs:
        text = format_prompt(pair.prompt, tokenizer, apply_chat_template, pair.where)
        prompt_tokens = len(tokenize_prompts([text], tokenizer, apply_chat_template)[0])
        if prompt_tokens > max_prompt_length:
            raise ValueError(f"{pair.where}: prompt of {prompt_tokens} tokens exceeds data.max_prompt_length="
                             f"{max_prompt_length}")
        for key in ("chosen", "rejected"):
            tokens = len(tokenizer(getattr(pair, key), add_special_tokens=False)["input_ids"]) + 1
            if tokens > max_response_length:
                raise ValueError(f"{pair.where}: '{key}' of {tokens} tokens (with EOS) exceeds "
                                 f"data.max_response_length={max_response_length}")


def encode_pairs(tokenizer: Any, pairs: Sequence[PreferencePair], max_response_length: int,
                 apply_chat_template: bool = True) -> Batch:
    """A pair Batch (module docstring) of ``pairs``; both sides are encoded exactly like SFT targets."""
    sides = {}
    for side in ("chosen", "rejected"):
        examples = [SFTExample(pair.prompt, getattr(pair, side)) for pair in pairs]
        sides[side] = encode_sft_examples(tokenizer, examples, max_response_length, apply_chat_template)
    return Batch(tensors={
        PairFields.CHOSEN_INPUT_IDS: sides["chosen"][Fields.INPUT_IDS],
        PairFields.CHOSEN_ATTENTION_MASK: sides["chosen"][Fields.ATTENTION_MASK],
        PairFields.REJECTED_INPUT_IDS: sides["rejected"][Fields.INPUT_IDS],
        PairFields.REJECTED_ATTENTION_MASK: sides["rejected"][Fields.ATTENTION_MASK],
        PairFields.MARGIN: torch.tensor([pair.margin for pair in pairs], dtype=torch.float32),
    })
