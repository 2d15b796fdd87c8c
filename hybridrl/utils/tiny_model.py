"""Tiny real Hugging Face models and tokenizers, built from a config and saved to disk — never downloaded.

The demo, the tests and the benchmarks use these: a real ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` with a handful of
layers and a character-level tokenizer with a chat template, saved with ``save_pretrained`` so that every loading path
(transformers, FSDP2 workers, vLLM) is exercised exactly as with a real checkpoint.

Head dimension is 32 by default: vLLM's CPU attention supports 32, 64, 80, 96, 112, 128, … but not 16.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

SPECIAL_TOKENS = ("<pad>", "<eos>", "<|user|>", "<|assistant|>")
# Characters of the synthetic tasks and short English prompts; every character is one token.
DEFAULT_CHARACTERS = "0123456789+-*/=()., ?abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ:'\n"
TOOL_TOKEN = "<|tool|>"
TOOL_CHARACTERS = '<>{}"_[];!#$%&@^|~`\\'
"""Extra characters of a tool-calling tiny tokenizer: the Hermes format's ``<tool_call>{"name": ...}</tool_call>`` and
the rest of printable ASCII (tool outputs and error messages are arbitrary text)."""
TOOL_WORDS = ("<tool_call>", "</tool_call>", '"name"', '"arguments"', '"calculator"', '"expression"')
"""Whole tokens of a tool-calling tiny tokenizer, as a real BPE vocabulary has them (Qwen2.5's has ``<tool_call>``):
a call is ~30 tokens, not ~80 characters."""
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}tools: {% for tool in tools %}{{ tool['function']['name'] }}"
    "{% if not loop.last %}, {% endif %}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] }}"
    "{% elif message['role'] == 'tool' %}<|tool|>{{ message['content'] }}"
    "{% else %}<|assistant|>{% if message['content'] %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>\n"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "\n</tool_call>{% endfor %}<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A ChatML-like template with tools (their names listed first: a tiny model's context is short) and a ``tool``
role; the model calls tools in the Hermes format (``hybridrl.agents.tools``). An assistant message's ``tool_calls``
are written back as the model writes them (``format_tool_call``), so a client that sends the conversation again
(``hybridrl serve`` keeps no session) shows the model the ids it sampled."""
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{{ message['content'] }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] }}"
    "{% else %}<|assistant|>{{ message['content'] }}<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a tiny decoder. ``num_heads × head_dim = hidden_size``; ``head_dim`` must be a vLLM-supported size."""

    architecture: str = "llama"  # a key of ARCHITECTURES (a Hugging Face model_type)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    vocab_size: Optional[int] = None  # None: the tokenizer's size


ARCHITECTURES: dict[str, dict] = {
    "llama": {}, "qwen2": {}, "mistral": {}, "granite": {}, "phi3": {}, "olmo2": {},
    "qwen3": {"head_dim": None},
    "gemma2": {"head_dim": None, "tie_word_embeddings": True},       # vLLM's Gemma 2 and 3 always tie the head
    "gemma3_text": {"head_dim": None, "tie_word_embeddings": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"head_dim": None, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": None,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
}
"""Hugging Face model types a :class:`TinyModelSpec` can build, with the config keys each needs beyond the common
ones (``None``: derived from the spec — ``head_dim`` as hidden / heads, ``moe_intermediate_size`` as half the MLP
width); the mixture-of-experts ones get 4 experts, 2 per token."""


def build_char_tokenizer(characters: str = DEFAULT_CHARACTERS, tool_chat: bool = False,
                         extra_specials: Sequence[str] = ()):
    """A character-level ``PreTrainedTokenizerFast`` with pad/eos tokens and a two-role chat template.

    ``tool_chat``: add the ``<|tool|>`` token (after every character, so the others keep their ids), the characters
    of tool calls and :data:`TOOL_CHAT_TEMPLATE`. ``extra_specials``: more whole tokens after those (a vision
    model's image placeholders).

    Returns:
        tokenizer whose vocabulary is ``SPECIAL_TOKENS`` followed by each distinct character of ``characters``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    ordered_characters = list(dict.fromkeys(characters + (TOOL_CHARACTERS if tool_chat else "")))
    specials = [*SPECIAL_TOKENS, *([TOOL_TOKEN] if tool_chat else []), *extra_specials]
    words = list(TOOL_WORDS) if tool_chat else []
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *ordered_characters, *specials[4:],
                                                         *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=None))
    whole = "|".join(re.escape(token) for token in [*specials, *words])
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(f"{whole}|.|\n"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=["<|user|>", "<|assistant|>", *specials[4:]],
        padding_side="left",
    )
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE if tool_chat else CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(spec: TinyModelSpec, vocab_size: int, *, pad_token_id: int, eos_token_id: int, seed: int = 0):
    """A randomly initialised causal LM of the given spec (fp32), deterministic in ``seed``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if spec.architecture not in ARCHITECTURES:
        raise ValueError(f"TinyModelSpec.architecture={spec.architecture!r}: expected one of {sorted(ARCHITECTURES)}")
    derived = {"head_dim": spec.hidden_size // spec.num_heads, "moe_intermediate_size": spec.intermediate_size // 2}
    extra = {key: derived[key] if value is None else value for key, value in ARCHITECTURES[spec.architecture].items()}
    config = AutoConfig.for_model(spec.architecture, **{
        "vocab_size": vocab_size, "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads,
        "intermediate_size": spec.intermediate_size, "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": spec.tie_word_embeddings, "pad_token_id": pad_token_id, "eos_token_id": eos_token_id,
        "bos_token_id": None, **extra})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def save_tiny_model(directory: str | Path, spec: TinyModelSpec = TinyModelSpec(), *, seed: int = 0,
                    characters: str = DEFAULT_CHARACTERS, tool_chat: bool = False) -> Path:
    """Build a tiny model + tokenizer and ``save_pretrained`` both into ``directory`` (safetensors). Returns the path.
    ``tool_chat``: the tool-calling tokenizer and template (``build_char_tokenizer``)."""
    directory = Path(directory)
    tokenizer = build_char_tokenizer(characters, tool_chat=tool_chat)
    model = build_tiny_model(spec, spec.vocab_size or len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, seed=seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def encode_chat(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of single-turn user prompts with the generation prompt appended (one list per prompt)."""
    encoded = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        encoded.append(list(ids))
    return encoded


def teach_tiny_model(directory: str | Path, conversations: Sequence[Sequence[dict]], *, tools: Sequence[dict] = (),
                     steps: int = 150, lr: float = 3e-3) -> Path:
    """Fine-tune the tiny model saved in ``directory`` until it has learnt ``conversations`` by heart (every token,
    a plain full-batch loop), and save it back: a real model whose replies a test can rely on — e.g. a tool call
    in the Hermes format, then an answer. ``tools``: rendered by the chat template as an agent would send them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    rows = [list(tokenizer.apply_chat_template(list(messages), tools=list(tools) or None, tokenize=True,
                                               return_dict=True)["input_ids"]) for messages in conversations]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [tokenizer.pad_token_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    labels = ids.masked_fill(mask == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model.train()
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return directory
