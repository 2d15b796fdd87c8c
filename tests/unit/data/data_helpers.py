"""Builders shared by the data tests (imported as ``data_helpers``; fixtures live in ``conftest.py``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

GSM8K_DIR = Path(os.environ.get("HYBRIDRL_GSM8K_DIR", Path(__file__).resolve().parents[4] / "shared/data/gsm8k"))

BPE_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def make_row(content: Any = "2+3=", ground_truth: Any = "5", *, data_source: str = "arithmetic",
             **overrides: Any) -> dict[str, Any]:
    """One prompt row in verl's schema; ``content`` becomes a single user message unless it is already a list."""
    prompt = content if isinstance(content, list) else [{"role": "user", "content": content}]
    row = {"data_source": data_source, "prompt": prompt, "ability": "arithmetic",
           "reward_model": {"style": "rule", "ground_truth": ground_truth}, "extra_info": {"index": 0}}
    row.update(overrides)
    return row


def build_bpe_tokenizer(corpus: list[str], *, vocab_size: int = 300):
    """A small byte-level BPE tokenizer trained on ``corpus`` whose post-processor adds ``<s>`` (like Llama), with a
    chat template that also starts with ``<s>`` — the case where double-BOS bugs show."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        pad_token="<pad>", padding_side="left")
    tokenizer.chat_template = BPE_CHAT_TEMPLATE
    return tokenizer
