"""Fixtures for the data tests: the char tokenizer and the real GSM8K copy (read-only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import GSM8K_DIR

from hybridrl.utils.tiny_model import build_char_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer():
    """The project's character-level tokenizer with its ``<|user|>…<|assistant|>`` chat template."""
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """The read-only GSM8K copy (skipped with the reason where it is absent)."""
    if not (GSM8K_DIR / "train.jsonl").is_file():
        pytest.skip(f"the GSM8K copy is not at {GSM8K_DIR} (set HYBRIDRL_GSM8K_DIR)")
    return GSM8K_DIR
